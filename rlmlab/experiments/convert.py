"""Convert a folder's JSON-lines records to Parquet: every per-expression results.jsonl (an
evaluation's or a probe's, with its traces moved to traces.parquet) and every metrics.jsonl.
Each file is replaced only after its Parquet form has been read back equal to it, record for
record; `rlmlab export` converts what it copies the same way. Parquet records written with an
older encoding are rewritten with today's (`records.COMPRESSION_LEVEL`), the same table.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.experiments.refs import read_refs, refer_to_siblings
from rlmlab.measuring.results import LEGACY_RESULTS, RESULTS, TRACES, read_results, write_rows
from rlmlab.records import reencode_records
from rlmlab.runlog import LEGACY_METRICS, METRICS, convert_metrics
from rlmlab.safeio import read_jsonl


def _files(root: Path, name: str) -> list[Path]:
    """Every regular file called `name` under `root`, symbolic links neither followed nor taken."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        if name in filenames and not os.path.islink(os.path.join(dirpath, name)):
            found.append(Path(dirpath) / name)
    return sorted(found)


def convert_results(folder: Path) -> None:
    """Replace `folder`'s results.jsonl by results.parquet (+ traces.parquet), summary.json
    untouched."""
    src = folder / LEGACY_RESULTS
    records = read_jsonl(src, DataError, "results file")
    keep = src.with_name(src.name + ".converting")
    src.replace(keep)  # write_rows removes a legacy file; it stays until the copy is checked
    try:
        write_rows(folder, records)
        if read_results(folder, required=()) != records:
            raise DataError(f"{src}: its records do not come back from Parquet unchanged; left as it is")
    except (DataError, ValueError) as e:
        for name in (RESULTS, TRACES):
            (folder / name).unlink(missing_ok=True)
        keep.replace(src)
        # named by the file left as it is, not by the Parquet files just removed
        raise DataError(str(e) if str(e).startswith(f"{src}:") else f"{src}: not converted ({e})") from None
    keep.unlink(missing_ok=True)


def convert_folder(root: str | Path) -> dict:
    """Convert every JSON-lines record file under `root`, then, for an experiment folder, hold by
    reference each run that a folder beside it holds byte for byte (`refs.refer_to_siblings`);
    returns counts and bytes before/after."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: not a folder")
    read_refs(root)  # its references are checked before anything is rewritten
    counts = {"results": 0, "metrics": 0, "reencoded": 0, "bytes_before": 0, "bytes_after": 0}
    for path in _files(root, LEGACY_RESULTS):
        counts["bytes_before"] += path.stat().st_size
        convert_results(path.parent)
        counts["results"] += 1
        counts["bytes_after"] += sum((path.parent / n).stat().st_size for n in (RESULTS, TRACES)
                                     if (path.parent / n).exists())
    for path in _files(root, LEGACY_METRICS):
        size = path.stat().st_size
        if convert_metrics(path.parent):
            counts["metrics"] += 1
            counts["bytes_before"] += size
            counts["bytes_after"] += (path.parent / METRICS).stat().st_size
    converted = {p for n in (RESULTS, TRACES, METRICS) for p in _files(root, n)}
    for path in sorted(converted):
        size = path.stat().st_size
        if reencode_records(path):
            counts["reencoded"] += 1
            counts["bytes_before"] += size
            counts["bytes_after"] += path.stat().st_size
    counts["referred"] = refer_to_siblings(root) if (root / "experiment.json").is_file() else []
    return counts

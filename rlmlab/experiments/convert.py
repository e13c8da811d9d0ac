"""Convert a folder's JSON-lines records to Parquet: every per-expression results.jsonl (an
evaluation's or a probe's, with its traces moved to traces.parquet) and every metrics.jsonl.
Parquet records written with an older encoding are rewritten with today's
(`records.COMPRESSION_LEVEL`), the same table; `rlmlab export` converts what it copies the
same way.

Each conversion is a transaction (`rlmlab.journal`): the new files are written beside the old
ones, read back equal to them record for record, and only then put in place, under a journal
that a re-run finishes if the process was killed. Every JSON-lines file is read in full before
anything is written; a line that is not a JSON object stops the conversion, naming it. No
symbolic link is followed, and nothing outside the folder converted is deleted.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.experiments.refs import read_refs, refer_to_siblings
from rlmlab.journal import JOURNAL, commit, recover, staged
from rlmlab.journal import LEFTOVERS as STAGED_LEFTOVERS
from rlmlab.measuring.result_files import LEGACY_RESULTS, RESULTS, TRACES, attach_traces, split_traces
from rlmlab.records import read_records, reencode_records, write_records
from rlmlab.runlog import LEGACY_METRICS, METRICS, convert_metrics
from rlmlab.safeio import parse_jsonl_objects, read_bytes

MAX_RECORD_BYTES = 1 << 30
# An earlier `rlmlab convert` moved results.jsonl here while it wrote the Parquet files; one
# that was killed left it there (and the Parquet files half written).
INTERRUPTED = LEGACY_RESULTS + ".converting"
# What a killed writer of records leaves: write_records' temporary files, a re-encoding not yet
# moved into place. Never read; removed before a conversion.
LEFTOVERS = tuple(f"{n}{s}" for n in (RESULTS, TRACES, METRICS) for s in (".tmp", ".reencoded", ".reencoded.tmp"))


def _walk(root: Path, links: list[Path]) -> list[tuple[Path, list[str]]]:
    """(folder, names of its regular files) of every folder under `root`, by path; symbolic
    links are neither followed nor listed, but collected in `links`."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        links += [here / n for n in sorted(dirnames + filenames) if os.path.islink(here / n)]
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(here / d))
        found.append((here, sorted(n for n in filenames if not os.path.islink(here / n))))
    return sorted(found)


def _read_lines(path: Path, what: str, cut_tail: bool = False) -> tuple[list[dict], str]:
    """The records of a JSON-lines file, every line checked, and the digest of its bytes."""
    data = read_bytes(path, DataError, what, limit=MAX_RECORD_BYTES)
    return parse_jsonl_objects(data, str(path), cut_tail=cut_tail), "sha256:" + hashlib.sha256(data).hexdigest()


def _check_results(folder: Path, replace: bool, name: str = LEGACY_RESULTS) -> tuple[list[dict], str]:
    """The records of `folder`'s results.jsonl (or `name`) and the digest of its bytes, every
    line checked."""
    if not replace and name == LEGACY_RESULTS and (folder / RESULTS).exists():
        raise DataError(f"{folder / LEGACY_RESULTS}: {RESULTS} is there too, and readers take it; "
                        "remove the one that is stale")
    records, digest = _read_lines(folder / name, "results file")
    if not records:  # every reader refuses it; converted, it would pass for a finished evaluation
        raise DataError(f"{folder / name}: no records (an evaluation or a probe writes one per expression)")
    return records, digest


def convert_results(folder: Path, replace: bool = False) -> None:
    """Replace `folder`'s results.jsonl by results.parquet (+ traces.parquet), summary.json
    untouched, as one transaction. A results.parquet already there is refused, or with
    `replace` (an export copying a run's JSON lines over its earlier export) replaced."""
    src = folder / LEGACY_RESULTS
    records, digest = _check_results(folder, replace)
    rows, traces = split_traces(records)
    new = {name: staged(folder / name) for name in (RESULTS, TRACES)}
    try:
        write_records(new[RESULTS], rows)
        if traces:
            write_records(new[TRACES], traces)
        back = read_records(new[RESULTS])
        if traces:
            attach_traces(back, new[TRACES])
        if back != records:
            raise DataError("its records do not come back from Parquet unchanged")
    except (DataError, ValueError) as e:
        for path in new.values():
            path.unlink(missing_ok=True)
        raise DataError(f"{src}: not converted, left as it is ({e})") from None
    # Readers take results.jsonl while no results.parquet is there, so that goes in last.
    steps = [("drop", RESULTS)] if (folder / RESULTS).is_file() else []
    if traces:
        steps.append(("put", TRACES))
    elif (folder / TRACES).is_file():
        steps.append(("drop", TRACES))
    commit(folder, steps + [("put", RESULTS), ("drop", LEGACY_RESULTS, digest)])


def _resume_interrupted(folder: Path) -> None:
    """Put back the results.jsonl that an earlier, killed `rlmlab convert` had moved aside, and
    remove the Parquet files it had begun from it, so that it is converted again in full."""
    if (folder / LEGACY_RESULTS).exists():
        raise DataError(f"{folder / INTERRUPTED}: left by a conversion that was killed, beside a "
                        f"{LEGACY_RESULTS}; keep the one that holds the results and remove the other")
    # Checked before it is put back: putting it back drops the Parquet files beside it.
    _check_results(folder, False, INTERRUPTED)
    commit(folder, [("put", LEGACY_RESULTS, INTERRUPTED)]
           + [("drop", name) for name in (RESULTS, TRACES) if (folder / name).is_file()])


def _recover(root: Path, links: list[Path]) -> None:
    """Finish or undo what a killed conversion left under `root`: journals rolled forward,
    staged and temporary files removed, results.jsonl moved aside by an older convert put back."""
    for folder, names in _walk(root, links):
        if JOURNAL in names or any(n.endswith(STAGED_LEFTOVERS) or n == JOURNAL + ".tmp" for n in names):
            recover(folder)
    for folder, names in _walk(root, []):
        for name in names:
            if name in LEFTOVERS:
                (folder / name).unlink()
        if INTERRUPTED in names:
            _resume_interrupted(folder)


def convert_folder(root: str | Path) -> dict:
    """Convert every JSON-lines record file under `root`, then, for an experiment folder, hold by
    reference each run that a folder beside it holds byte for byte (`refs.refer_to_siblings`);
    returns counts, bytes before/after and the symbolic links left alone."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: not a folder")
    read_refs(root)  # its references are checked before anything is rewritten
    links: list[Path] = []
    _recover(root, links)
    folders = _walk(root, [])
    legacy = [(folder, name) for folder, names in folders for name in (LEGACY_RESULTS, LEGACY_METRICS) if name in names]
    for folder, name in legacy:  # every line checked before the first file changes
        if name == LEGACY_RESULTS:
            _check_results(folder, replace=False)
        else:
            _read_lines(folder / name, "training log", cut_tail=True)
    counts = {"results": 0, "metrics": 0, "reencoded": 0, "bytes_before": 0, "bytes_after": 0,
              "links": sorted(str(p.relative_to(root)) for p in links)}
    for folder, name in legacy:
        counts["bytes_before"] += (folder / name).stat().st_size
        if name == LEGACY_RESULTS:
            convert_results(folder)
            counts["results"] += 1
            written = (RESULTS, TRACES)
        else:
            counts["metrics"] += convert_metrics(folder)
            written = (METRICS,)
        counts["bytes_after"] += sum((folder / n).stat().st_size for n in written if (folder / n).is_file())
    for folder, _ in _walk(root, []):
        for name in (RESULTS, TRACES, METRICS):
            path = folder / name
            if path.is_file() and not path.is_symlink():
                size = path.stat().st_size
                if reencode_records(path):
                    counts["reencoded"] += 1
                    counts["bytes_before"] += size
                    counts["bytes_after"] += path.stat().st_size
    counts["referred"] = refer_to_siblings(root) if (root / "experiment.json").is_file() else []
    return counts

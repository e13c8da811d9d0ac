"""Report time on records in Parquet against the same records in JSON lines (goal: Parquet no
slower). Copies an experiment folder twice into a temporary folder, one copy in each form
(a Parquet folder is written back to JSON lines for the comparison, a JSON-lines folder is
converted), and times `rlmlab report` on each, alternating, in CPU and wall seconds.

    python benchmarks/bench_report.py [results/iid-paper-cpu] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

from rlmlab.experiments.convert import convert_folder  # noqa: E402
from rlmlab.experiments.report import report  # noqa: E402
from rlmlab.measuring.result_files import LEGACY_RESULTS, RESULTS, TRACES, read_results  # noqa: E402
from rlmlab.runlog import LEGACY_METRICS, METRICS, read_metrics  # noqa: E402


def to_jsonl(folder: Path) -> None:
    """Write a converted folder's records back as the JSON lines they came from."""
    for path in list(folder.rglob(RESULTS)):
        rows = read_results(path.parent, required=())
        (path.parent / LEGACY_RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows))
        path.unlink()
        (path.parent / TRACES).unlink(missing_ok=True)
    for path in list(folder.rglob(METRICS)):
        recs = read_metrics(path.parent)
        (path.parent / LEGACY_METRICS).write_text("".join(json.dumps(r) + "\n" for r in recs))
        path.unlink()


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and "report" not in p.parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("folder", nargs="?", default="results/iid-paper-cpu")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print_facts()
    src = Path(args.folder)
    with tempfile.TemporaryDirectory() as d:
        forms = {"jsonl": Path(d) / "jsonl" / src.name, "parquet": Path(d) / "parquet" / src.name}
        for path in forms.values():
            shutil.copytree(src, path, ignore=shutil.ignore_patterns("refs.json"))
        to_jsonl(forms["jsonl"])
        convert_folder(forms["parquet"])
        times = {name: [] for name in forms}
        for _ in range(args.repeats):
            for name, path in forms.items():
                c0, w0 = time.process_time(), time.perf_counter()
                report(path, Path(d) / f"report-{name}")
                times[name].append((time.process_time() - c0, time.perf_counter() - w0))
        same = all((Path(d) / "report-jsonl" / f.name).read_bytes() == f.read_bytes()
                   for f in (Path(d) / "report-parquet").iterdir() if f.suffix in (".md", ".json", ".tex"))
        for name, path in forms.items():
            cpu = sorted(t[0] for t in times[name])
            wall = sorted(t[1] for t in times[name])
            print(f"{name:8s} {size(path) / 1e6:7.1f} MB of records: report {cpu[0]:.2f}-{cpu[-1]:.2f} s CPU, "
                  f"{wall[0]:.2f}-{wall[-1]:.2f} s wall ({args.repeats} runs)")
        print(f"tables and report.json identical in both forms: {same}")


if __name__ == "__main__":
    main()

"""Wall time of the README's main job, `rlmlab demo`, from an empty output folder.

Goal (issue 6): at most 10 minutes on the 2-core development machine. The demo rebuilds the
seed-42 pool (500,000 expressions) and the paper-cpu preset's length split (L = 595), then
decodes the released RM and CoT checkpoints on `--per-bin` expressions per bin. Stages are timed from the
demo's own progress: pool + split, each learner's evaluation, the report.

    python benchmarks/bench_demo.py [--per-bin 40] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-bin", type=int, default=40)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print_facts()
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}")
    from rlmlab.cli import main as cli
    from rlmlab.cli.demo_cmd import PRESET
    from rlmlab.experiments.presets import get_preset
    from rlmlab.measuring.result_files import find_eval_dir

    job = f"length-{get_preset(PRESET).length}"

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo"
        t0, start_wall = time.perf_counter(), time.time()
        rc = cli(["demo", "--out", str(out), "--per-bin", str(args.per_bin), "--quiet"])
        total = time.perf_counter() - t0
        stamps = {}
        for learner in ("rm", "cot"):
            summary = find_eval_dir(out / job / learner, "eval") / "summary.json"
            if summary.exists():
                stamps[learner] = summary.stat().st_mtime - start_wall
    print(f"exit status {rc}; load average (1 min) at end: {os.getloadavg()[0]:.2f}")
    print(f"rlmlab demo --per-bin {args.per_bin}: {total:.0f} s ({total / 60:.1f} min) in all; goal <= 600 s")
    if stamps:
        print("evaluation finished at (s after start): " + ", ".join(f"{v} {s:.0f}" for v, s in stamps.items()))


if __name__ == "__main__":
    main()

"""Pool generation speed: the paper's 500k seed-42 pool (goal: at most 60 s on 2 cores).

    python benchmarks/bench_pool.py [--n 500000] [--seed 42] [--workers N]
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

from rlmlab.task.pool import build_pool, write_pool  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    args = ap.parse_args()
    print_facts()
    t0 = time.perf_counter()
    table = build_pool(args.n, args.seed, args.workers, task=PAPER)
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        write_pool(table, Path(d) / "pool.parquet")
        size = (Path(d) / "pool.parquet").stat().st_size
    t2 = time.perf_counter()
    print(f"pool n={args.n} seed={args.seed} workers={args.workers}: sample+execute {t1 - t0:.1f}s, "
          f"write {t2 - t1:.1f}s, total {t2 - t0:.1f}s, {args.n / (t2 - t0):,.0f} expr/s, "
          f"file {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()

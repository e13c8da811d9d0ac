"""Norms of a learned position table's rows, in ranges around the training threshold (issue 67).

    python benchmarks/position_rows.py RUN_DIR [RUN_DIR ...] [--threshold 595] [--which best]

RUN_DIR is a run folder holding a `best/` (or `last/`) checkpoint, e.g.
`runs/length-595/length-595/cot` or `rlmlab/released/paper-cpu-length-595/cot`. A model trained
with every example at position 0 never sends a gradient to the rows past its longest trace,
and weight decay shrinks them toward zero; training with random start offsets
(`train.start_offset`) trains them all. For each run it prints min, median and max row norm
over rows [0, L), [L, 2L) and [2L, end of table), and the same for the whole trained part.
Nothing is trained or decoded; the checkpoint is loaded and checked as `rlmlab eval` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import print_facts  # noqa: E402

from rlmlab.errors import RlmlabError  # noqa: E402


def ranges(threshold: int, rows: int) -> list[tuple[int, int]]:
    cuts = [0, min(threshold, rows), min(2 * threshold, rows), rows]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--threshold", type=int, default=595, help="L: the longest training trace (tokens)")
    ap.add_argument("--which", choices=("best", "last"), default="best")
    args = ap.parse_args(argv)
    if args.threshold < 1:
        ap.error("--threshold must be at least 1")
    from rlmlab.learning.checkpoint import load_run

    print_facts()
    for run in args.runs:
        try:
            loaded = load_run(run, args.which)
        except RlmlabError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if loaded.model.wpe is None:
            print(f"{run}: positions '{loaded.model.cfg.positions}', no learned table")
            continue
        norms = loaded.model.wpe.weight.detach().norm(dim=1)
        parts = [f"rows {a}-{b - 1}: {norms[a:b].min():.3f} / {norms[a:b].median():.3f} / {norms[a:b].max():.3f}"
                 for a, b in ranges(args.threshold, len(norms))]
        offset = loaded.config.get("train", {}).get("start_offset", 0)
        print(f"{run} ({args.which}, step {loaded.step}, start_offset {offset}); row norm min / median / max:")
        for p in parts:
            print("  " + p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

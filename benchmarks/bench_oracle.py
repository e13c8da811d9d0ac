"""Oracle decoding time against trace length: `rlmlab eval --oracle` on single large expressions.

    python benchmarks/bench_oracle.py [--max-level 7]

Each row decodes one expression with the oracle (RM: on the active frame; CoT: on Pi_rec of
the trace) and prints its trace length, the seconds taken and microseconds per token, beside
`execute` (what `rlmlab trace` does) on the same expression. The expressions are complete
ternary trees `triple_add(t, t, t)` of growing height: the root frame's written call grows
with the whole expression, so a per-step cost proportional to the frame's length shows as
microseconds per token that grow with the trace; near-linear decoding keeps them flat.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

from rlmlab.decoding.driver import generate  # noqa: E402
from rlmlab.decoding.oracle import oracle_predictor  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def tree(height: int) -> str:
    return "3" if height == 0 else f"triple_add({tree(height - 1)},{tree(height - 1)},{tree(height - 1)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-level", type=int, default=4)
    ap.add_argument("--max-level", type=int, default=7)
    args = ap.parse_args()
    print_facts()
    vocab = PAPER.vocab
    print(f"{'height':>6} {'trace':>8} {'execute s':>10} {'rm s':>8} {'rm us/tok':>10} {'cot s':>8} {'cot us/tok':>11}")
    for h in range(args.min_level, args.max_level + 1):
        expr = PAPER.parse(tree(h))
        t0 = time.perf_counter()
        n = PAPER.execute(expr).trace_len
        t_exec = time.perf_counter() - t0
        row = [f"{h:>6}", f"{n:>8,}", f"{t_exec:>10.2f}"]
        for learner in ("rm", "cot"):
            t0 = time.perf_counter()
            (g,) = generate(oracle_predictor(learner, vocab, library=PAPER.library), [expr], vocab, learner, library=PAPER.library)
            dt = time.perf_counter() - t0
            assert g.valid, g.reason
            row += [f"{dt:>8.2f}", f"{1e6 * dt / n:>10.1f}" + (" " if learner == "cot" else "")]
        print(" ".join(row), flush=True)


if __name__ == "__main__":
    main()

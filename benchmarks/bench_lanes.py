"""Training cost per expression: RM lane-packed vs RM per-frame examples vs CoT.

One epoch (forward + backward + optimizer step) over the same pool expressions for each packing,
interleaved round by round so that host noise hits all three alike. Reports processed
positions (padding included) and wall time per expression, and their ratios to CoT.
Goal (issue 5): RM lane-packed <= 1.6x the CoT positions and <= 1.8x the CoT wall time.

    python benchmarks/bench_lanes.py [--presets small,paper] [--n 200] [--rounds 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from machine import print_facts  # noqa: E402

from rlmlab.learning.config import DataSettings, TrainConfig  # noqa: E402
from rlmlab.learning.examples import build_examples  # noqa: E402
from rlmlab.learning.model import Transformer, preset  # noqa: E402
from rlmlab.learning.optim import configure_optimizer  # noqa: E402
from rlmlab.learning.packing import pack_rows  # noqa: E402
from rlmlab.learning.step import train_step  # noqa: E402
from rlmlab.task.pool import build_pool  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

PACKINGS = ("rm", "rm-frames", "cot")


def epoch_seconds(model, optimizer, data, rows, tc) -> float:
    t0 = time.perf_counter()
    # About 64 examples' worth of positions per step, as the trainer does.
    budget = max(1, int(tc.batch_size * float((data.lengths - 1).mean())))
    step, got = [], 0
    for r in rows:
        step.append(r)
        got += r.length
        if got >= budget:
            train_step(model, model, optimizer, data, step, data.vocab.pad_id, tc, torch.device("cpu"))
            step, got = [], 0
    if step:
        train_step(model, model, optimizer, data, step, data.vocab.pad_id, tc, torch.device("cpu"))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--presets", default="small,paper")
    ap.add_argument("--n", type=int, default=200, help="pool expressions (seed 42) per epoch")
    ap.add_argument("--max-trace", type=int, default=600, help="skip traces longer than this (keeps it short)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print_facts()
    pool = build_pool(20_000, 42, workers=1, task=PAPER).to_pylist()
    texts = [r["expr"] for r in pool if r["trace_len"] <= args.max_trace][:args.n]
    vocab = PAPER.vocab
    data = {v: build_examples(texts, v, vocab, task=PAPER) for v in PACKINGS}
    print(f"{len(texts)} expressions, trace length <= {args.max_trace}")
    for name in args.presets.split(","):
        tc = TrainConfig(max_steps=1)
        setups = {}
        for v in PACKINGS:
            torch.manual_seed(0)
            model = Transformer(preset(name, v, len(vocab)))
            rows = pack_rows(data[v].lengths - 1, DataSettings(learner=v).row_length)
            processed = sum(r.length for r in rows)
            setups[v] = (model, configure_optimizer(model, tc), rows, processed)
        times = {v: [] for v in PACKINGS}
        for _ in range(args.rounds):
            for v in PACKINGS:
                model, opt, rows, _ = setups[v]
                times[v].append(epoch_seconds(model, opt, data[v], rows, tc))
        cot_pos, cot_s = setups["cot"][3], min(times["cot"])
        print(f"\npreset {name}: per training expression (best of {args.rounds} epochs)")
        print(f"{'packing':<11}{'positions':>11}{'x CoT':>8}{'ms':>9}{'x CoT':>8}{'targets':>9}")
        for v in PACKINGS:
            pos, s = setups[v][3], min(times[v])
            print(f"{v:<11}{pos / len(texts):>11.1f}{pos / cot_pos:>8.2f}{1e3 * s / len(texts):>9.2f}"
                  f"{s / cot_s:>8.2f}{data[v].n_targets / len(texts):>9.1f}")


if __name__ == "__main__":
    main()

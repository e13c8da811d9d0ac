"""Training throughput: useful tokens/s and model FLOPs utilisation against a measured fp32 peak.

    python benchmarks/bench_train.py                         # small + paper, rm + cot, < 3 min
    python benchmarks/bench_train.py --presets small --learners rm --seconds 30
    python benchmarks/bench_train.py --presets small --learners plain:128,plain:512 --threads 1
    python benchmarks/bench_train.py --presets cpu --learners cot,cot@none,cot@rope,cot@alibi --threads 1

Each configuration runs real optimizer steps of `rlmlab.learning.step` (packed rows at the training
row length, batch_size examples' worth of positions per step, AdamW, clipping) on a seed-42
pool sample (the IID distribution: CoT traces up to the block size), after a short warm-up
step, for at least `--seconds` and at least one step. The peak is the best fp32 2048^3
matmul rate measured before, between and after the runs, so host noise can only lower the MFU.

FLOPs of one example of n positions (inputs), fwd + bwd, counting only what the example needs:
    6 * N * n  +  12 * n_layer * n_embd * P
N = non-embedding parameters (token and position tables excluded; the tied output projection
is not counted either); P = the (query, key) pairs the example's attention mask allows:
n(n+1)/2 for a causal example (CoT, rm-frames), fewer for a lane-packed RM trace (rm), whose
frames see only themselves. QK^T and AV cost 2 * n_embd FLOPs each per pair and layer, and the
backward pass twice the forward. Padding and the masked-out part of packed rows count for
nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

from rlmlab.attention.positions import context_limit  # noqa: E402
from rlmlab.learning.config import DataSettings, TrainConfig  # noqa: E402
from rlmlab.learning.data import fit_to_block  # noqa: E402
from rlmlab.learning.examples import ExampleSet, build_examples  # noqa: E402
from rlmlab.learning.learner import get_learner  # noqa: E402
from rlmlab.learning.model import Transformer, preset  # noqa: E402
from rlmlab.learning.optim import configure_optimizer  # noqa: E402
from rlmlab.learning.packing import (  # noqa: E402
    Row,
    RowStream,
    collate,
    micro_batches,
    padding_fraction,
)
from rlmlab.learning.step import train_step  # noqa: E402
from rlmlab.task.pool import build_pool  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def matmul_peak(seconds: float = 3.0, n: int = 2048) -> float:
    """Best fp32 GFLOP/s of an n^3 matmul over `seconds`."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best, t_end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best / 1e9


def useful_flops(model: Transformer, data, rows: list[Row]) -> tuple[float, float]:
    """(total, attention part) training FLOPs of the examples in `rows`, from the (query, key)
    pairs their attention masks allow: n(n+1)/2 for a plain causal example of n positions,
    fewer for a lane-packed RM trace, whose frames see only themselves."""
    c = model.cfg
    N = sum(p.numel() for name, p in model.named_parameters() if not name.startswith(("wte", "wpe")))
    tokens, pairs = 0, 0
    for mb in micro_batches(rows, 16384):
        b = collate(data.ids, data.loss, data.offsets, mb, data.vocab.pad_id, data.layout)
        real = b.doc >= 0  # (B, T)
        tokens += int(real.sum())
        mask = b.attention("dense").mask
        if mask is None:  # one example per row from position 0: plain causal
            n = real.sum(1)
            pairs += int((n * (n + 1) // 2).sum())
        else:
            pairs += int(mask[:, 0][real].sum())
    attention = 12.0 * c.n_layer * c.n_embd * pairs
    return 6.0 * N * tokens + attention, attention


def plain_data(T: int, n: int = 512) -> ExampleSet:
    """The ceiling the packed learners are measured against: n random sequences of exactly T
    positions, loss on every target, so each fills one row on its own (plain causal
    attention, no mask, no padding)."""
    vocab = PAPER.vocab
    ids = np.random.default_rng(0).integers(0, len(vocab), size=n * (T + 1)).astype(np.uint16)
    loss = np.ones(n * (T + 1), dtype=bool)
    loss[::T + 1] = False
    return ExampleSet(f"plain:{T}", vocab, ids, loss, np.arange(n + 1, dtype=np.int64) * (T + 1),
                    np.arange(n, dtype=np.int64), n)


def bench(name: str, learner: str, data, seconds: float, tc: TrainConfig, row_len: int) -> dict:
    torch.manual_seed(0)
    encoding = {} if learner.startswith("plain:") or get_learner(learner).encoding is None else \
        {"positions": get_learner(learner).encoding}
    base = "cot" if learner.startswith("plain:") else get_learner(learner).base
    model = Transformer(preset(name, base, len(data.vocab), **encoding))
    data, dropped = fit_to_block(data, context_limit(model.cfg), True, "benchmark")
    optimizer = configure_optimizer(model, tc)
    positions = data.lengths - 1
    stream = RowStream(positions, row_len, seed=0)
    step_tokens = round(tc.batch_size * float(positions.mean()))
    # Warm-up on an eighth of a step: first-call costs (allocations, kernel selection) are not training.
    train_step(model, model, optimizer, data, stream.take(step_tokens // 8), data.vocab.pad_id, tc,
               torch.device("cpu"))
    steps, tokens, processed, timed_rows = 0, 0, 0, []
    t0 = time.perf_counter()
    while steps == 0 or time.perf_counter() - t0 < seconds:
        rows = stream.take(step_tokens)
        _, n_tok, _ = train_step(model, model, optimizer, data, rows, data.vocab.pad_id, tc, torch.device("cpu"))
        steps, tokens, processed = steps + 1, tokens + n_tok, processed + sum(r.length for r in rows)
        timed_rows += rows
    dt = time.perf_counter() - t0
    flops, attention = useful_flops(model, data, timed_rows)
    return {"preset": name, "learner": learner, "row_len": row_len, "params": model.num_params(include_positions=False),
            "steps": steps, "step_tokens": step_tokens, "tok_s": tokens / dt, "processed_tok_s": processed / dt,
            "gflop_s": flops / dt / 1e9, "attention_share": attention / flops,
            "padding": padding_fraction(timed_rows, positions), "dropped": dropped,
            "row_lengths": sorted({r.length for r in timed_rows})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="small,paper")
    ap.add_argument("--learners", "--views", dest="learners", default="rm,cot",  # --views: the old spelling
                    help="any of rm (lane-packed), rm-frames, cot, and plain:T "
                    "(random sequences of exactly T positions, one per row: the plain causal ceiling); a learner "
                    "may name a position encoding, as in cot@rope")
    ap.add_argument("--seconds", type=float, default=12.0, help="timed seconds per configuration (after warm-up)")
    ap.add_argument("--pool", type=int, default=1000, help="expressions sampled with seed 42")
    ap.add_argument("--max-trace", type=int, default=None, help="keep expressions with traces up to this length")
    ap.add_argument("--row-len", type=int, default=None, help="base row length (default: the training default "
                    "of each learner)")
    ap.add_argument("--batch-size", type=int, default=TrainConfig().batch_size)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print_facts()
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores "
          "(anything else running lowers every figure below)")
    t_start = time.perf_counter()
    peak = matmul_peak()
    print(f"fp32 matmul 2048^3 peak: {peak:.1f} GFLOP/s")

    table = build_pool(args.pool, 42, workers=1, task=PAPER)
    exprs = table.column("expr").to_pylist()
    if args.max_trace:
        exprs = [e for e, n in zip(exprs, table.column("trace_len").to_pylist()) if n <= args.max_trace]
    tc = TrainConfig(batch_size=args.batch_size, max_steps=1)
    results = []
    with tempfile.TemporaryDirectory() as cache:
        data = {v: plain_data(int(v.split(":")[1])) if v.startswith("plain:") else
                build_examples(exprs, get_learner(v).base, PAPER.vocab, workers=os.cpu_count() or 1, cache_dir=cache, task=PAPER)
                for v in args.learners.split(",")}
        for name in args.presets.split(","):
            for learner in args.learners.split(","):
                row_len = (int(learner.split(":")[1]) if learner.startswith("plain:")
                           else args.row_len or DataSettings(learner=get_learner(learner).base).row_length)
                peak = max(peak, matmul_peak(1.0))
                r = bench(name, learner, data[learner], args.seconds, tc, row_len)
                results.append(r)
                print(f"  {name:6s} {learner:3s} {r['params'] / 1e6:5.2f}M  {r['tok_s']:8,.0f} useful tok/s  "
                      f"{r['gflop_s']:6.1f} GFLOP/s  ({r['steps']} steps of {r['step_tokens']:,} positions, rows "
                      f"{'/'.join(map(str, r['row_lengths']))}, padding {r['padding']:.1%}, attention "
                      f"{r['attention_share']:.0%} of FLOPs, dropped {r['dropped']} too long)", flush=True)
    peak = max(peak, matmul_peak())
    print(f"peak used: {peak:.1f} GFLOP/s (best of the measurements before, between and after the runs); "
          f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")
    print("| preset | learner | params | row | useful tok/s | useful GFLOP/s | MFU | padding |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['preset']} | {r['learner']} | {r['params'] / 1e6:.2f}M | {r['row_len']} | {r['tok_s']:,.0f} | "
              f"{r['gflop_s']:.1f} | {r['gflop_s'] / peak:.0%} | {r['padding']:.1%} |")
    print(f"total {time.perf_counter() - t_start:.0f}s")


if __name__ == "__main__":
    main()

"""Attention over packed rows: the dense block-diagonal mask against the blocks backend.

    python benchmarks/bench_attention.py [--rows 32] [--threads 1]

For rows packed the way training packs them (seed-42 pool, small-preset shapes: 4 heads of
32), one forward + backward of attention alone with q, k, v of the row's shape, median of
`--repeats`. Compared: `scaled_dot_product_attention` with the dense (B, 1, T, T) mask (or
plain `is_causal` for rows of one example), and `rlmlab.attention.backends.Blocks` with pieces of
`--chunks` queries (construction included). Every variant's output and gradients are first
checked against the dense mask's. The pair counts say why: the CPU kernel's cost follows
the (query, key) pairs it is given, masked or not, and is_causal does not skip the upper
triangle (see the `causal/full` line).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

from rlmlab.attention.backends import Blocks  # noqa: E402
from rlmlab.learning.examples import build_examples  # noqa: E402
from rlmlab.learning.packing import collate, pack_rows  # noqa: E402
from rlmlab.task.pool import build_pool  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def fwd_bwd_ms(fn, inputs, grad, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first call is warm-up
        t0 = time.perf_counter()
        y = fn()
        torch.autograd.grad((y * grad).sum(), inputs)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=32, help="rows per measured batch")
    ap.add_argument("--chunks", default="64,128,256")
    ap.add_argument("--max-pieces", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print_facts()
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    exprs = build_pool(400, 42, workers=1, task=PAPER).column("expr").to_pylist()
    nh, hs = 4, 32
    cases = [("cot", 512, "packed"), ("cot", 1024, "solo"), ("rm", 128, "packed"), ("rm-frames", 128, "packed"),
             ("rm", 512, "packed")]
    chunks = [int(c) for c in args.chunks.split(",")]
    print("| learner | rows | dense mask ms | " + " | ".join(f"blocks c={c} ms" for c in chunks)
          + " | pairs dense / blocks c=128 / useful |")
    print("|---|---|---|" + "---|" * len(chunks) + "---|")
    for learner, T, kind in cases:
        data = build_examples(exprs, learner, PAPER.vocab, task=PAPER)
        rows = [r for r in pack_rows(data.lengths - 1, T if kind == "packed" else 128) if r.length == T]
        rows = [r for r in rows if (len(r.examples) == 1) == (kind == "solo")][:args.rows]
        if not rows:
            continue
        b = collate(data.ids, data.loss, data.offsets, rows, data.vocab.pad_id, data.layout)
        B = len(rows)
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, nh, T, hs, requires_grad=True) for _ in range(3))
        real = (b.doc >= 0)[:, None, :, None]
        grad = torch.randn(B, nh, T, hs) * real
        mask = b.attention("dense").mask
        dense = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)  # noqa: E731
        ref = dense()
        ref_grads = torch.autograd.grad((ref * grad).sum(), (q, k, v))
        length = b.blocks[:, 2]
        layout = b.layout()
        cells, pairs = [], {}
        for c in chunks:
            make = lambda c=c: Blocks(layout, chunk=c, max_pieces=args.max_pieces)  # noqa: E731
            out = make().attend(q, k, v)
            grads = torch.autograd.grad((out * grad).sum(), (q, k, v))
            torch.testing.assert_close(out * real, ref * real, atol=1e-5, rtol=1e-5)
            for a, r in zip(grads, ref_grads):
                torch.testing.assert_close(a, r, atol=1e-4, rtol=1e-4)
            pairs[c] = sum(E * Lq * Lk for E, Lq, Lk, _ in make().groups)
            cells.append(f"{fwd_bwd_ms(lambda: make().attend(q, k, v), (q, k, v), grad, args.repeats):.1f}")
        useful = int((length * (length + 1) // 2).sum())
        pair_cell = f"{B * T * T / 1e6:.2f}M / {pairs.get(128, 0) / 1e6:.2f}M / {useful / 1e6:.2f}M"
        print(f"| {learner} | {B} x {T} ({kind}) | {fwd_bwd_ms(dense, (q, k, v), grad, args.repeats):.1f} | "
              + " | ".join(cells) + f" | {pair_cell} |", flush=True)
    E, L = 32, 512
    q, k, v = (torch.randn(E, nh, L, hs, requires_grad=True) for _ in range(3))
    grad = torch.randn(E, nh, L, hs)
    causal = fwd_bwd_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), grad, args.repeats)
    full = fwd_bwd_ms(lambda: F.scaled_dot_product_attention(q, k, v), (q, k, v), grad, args.repeats)
    print(f"causal/full: is_causal {causal:.1f} ms vs no mask {full:.1f} ms at {E} x {L} (ratio {causal / full:.2f}; "
          "0.5 would mean the upper triangle is skipped)")
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""Training throughput of the trainer's device path: step time, useful tokens/s and MFU per learner.

    python benchmarks/bench_gpu.py                          # CUDA: paper model; CPU: small model
    python benchmarks/bench_gpu.py --device cpu --preset small --seconds 10
    python benchmarks/bench_gpu.py --learners cot --no-compile  # CUDA without torch.compile

Each learner runs real optimizer steps of `rlmlab.learning.step.train_step` on a seed-42 pool
sample (IID traces, those longer than the model's block dropped) exactly as the trainer runs
them on that device: on CUDA bf16 autocast, TF32, FlexAttention over fixed-length micro-batch
rows (`--micro-batch-tokens`, default 65,536 on CUDA: one micro-batch per paper-sized step) and
torch.compile (default on CUDA); on CPU fp32 and the blocks attention. The loss and gradient norm
stay on the device (no host wait per step); the clock is read after a device synchronisation
at both ends of the timed steps, after `--warmup` steps (compilation, kernel selection).

Useful FLOPs count only what the examples need (`bench_train.useful_flops`: 6 N per position
plus 12 L d per allowed (query, key) pair); MFU divides them by the best dense matmul rate
measured on the device (bf16 8192^3 on CUDA, fp32 2048^3 on CPU), so it is a fraction of what
this machine does, not of a datasheet figure. `--kernels` also counts the CUDA kernels of one
step with the profiler.

On CUDA the fused FlexAttention kernel is first checked against the dense mask (outputs and
gradients, with and without lanes, on random packed layouts); the benchmark stops if it differs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch.nn.functional as F  # noqa: E402
from bench_train import useful_flops  # noqa: E402
from machine import print_facts  # noqa: E402

from rlmlab.attention.backends import attention_kind  # noqa: E402
from rlmlab.attention.flex import Flex, flex_attend  # noqa: E402
from rlmlab.attention.layout import Layout  # noqa: E402
from rlmlab.learning.config import DataSettings, TrainConfig  # noqa: E402
from rlmlab.learning.data import fit_to_block  # noqa: E402
from rlmlab.learning.examples import build_examples  # noqa: E402
from rlmlab.learning.model import Transformer, preset  # noqa: E402
from rlmlab.learning.optim import configure_optimizer  # noqa: E402
from rlmlab.learning.packing import RowStream, padding_fraction  # noqa: E402
from rlmlab.learning.step import FiniteGuard, flat_length, resolve_device, train_step  # noqa: E402
from rlmlab.task.pool import build_pool  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device, seconds: float = 3.0) -> float:
    """Best dense matmul GFLOP/s over `seconds`: bf16 8192^3 on CUDA, fp32 2048^3 on CPU."""
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (2048, torch.float32)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    a @ b
    sync(device)
    best, t_end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        sync(device)
        best = max(best, 4 * 2 * n ** 3 / (time.perf_counter() - t0))
    return best / 1e9


def dense_block_mask(B: int, T: int, row, start, length, frame=None, branch=None) -> torch.Tensor:
    """(B, 1, T, T) bool, the mask a `Flex` backend stands for, built independently; positions outside every block see
    themselves only (their outputs are not compared)."""
    mask = torch.eye(T, dtype=torch.bool).repeat(B, 1, 1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for r, s, n in zip(row.tolist(), start.tolist(), length.tolist()):
        block = causal[:n, :n].clone()
        if frame is not None:
            f, b = frame[r, s:s + n], branch[r, s:s + n]
            block &= (f[:, None] == f[None, :]) & ((b[None, :] == -1) | (b[:, None] == b[None, :]))
        mask[r, s:s + n, s:s + n] = block
    return mask.unsqueeze(1)


def check_flex_kernel(device: torch.device) -> None:
    """The compiled FlexAttention kernel the trainer runs against the dense mask, in true fp32.

    TF32 is switched off for the check: with it, both kernels round their dot products to
    10-bit mantissas in different orders, and on an H200 that alone put a few of 256,000 elements
    up to 5e-3 apart, which would hide nothing yet fail a tolerance meant for fp32."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        _check_flex_kernel(device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _check_flex_kernel(device: torch.device) -> None:
    gen = torch.Generator().manual_seed(0)
    B, T = 2, 1000
    for lanes in (False, True):
        row, start, length = [], [], []
        for r in range(B):
            t = 0
            while t < T - 1:
                n = int(torch.randint(1, min(400, T - t), (1,), generator=gen))
                row.append(r), start.append(t), length.append(n)
                t += n
        row, start, length = (torch.tensor(a) for a in (row, start, length))
        frame = torch.randint(0, 3, (B, T), generator=gen) if lanes else None
        branch = torch.randint(-1, 2, (B, T), generator=gen) if lanes else None
        dense = dense_block_mask(B, T, row, start, length, frame, branch).to(device)
        inside = torch.zeros(B, T, dtype=torch.bool)
        for r, s, n in zip(row.tolist(), start.tolist(), length.tolist()):
            inside[r, s:s + n] = True
        keep = inside.to(device)[:, None, :, None]
        q, k, v = (torch.randn(B, 4, T, 32, device=device, requires_grad=True) for _ in range(3))
        g = torch.randn(B, 4, T, 32, device=device) * keep
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
        flex = Flex(Layout.packed(B, T, row, start, length, frame, branch)).to(device)
        out = flex_attend(q, k, v, flex.block_mask())
        grads = zip(torch.autograd.grad((out * g).sum(), (q, k, v)), torch.autograd.grad((ref * g).sum(), (q, k, v)))
        for a, b in [(out * keep, ref * keep), *grads]:
            torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)
    print("FlexAttention kernel: equal to the dense mask (outputs and gradients, with and without lanes)")


def count_kernels(step, device: torch.device) -> int:
    """CUDA kernels one call of `step` launches (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        sync(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def bench(learner: str, data, name: str, device: torch.device, tc: TrainConfig, compile_model: bool,
          seconds: float, warmup: int, kernels: bool) -> dict:
    torch.manual_seed(0)
    model = Transformer(preset(name, learner, len(data.vocab))).to(device)
    data, dropped = fit_to_block(data, model.cfg.block_size, True, "benchmark")
    optimizer = configure_optimizer(model, tc)
    fwd = torch.compile(model) if compile_model else model
    kind = attention_kind(device, model.cfg)
    positions = data.lengths - 1
    stream = RowStream(positions, DataSettings(learner=learner).row_length, seed=0)
    step_tokens = round(tc.batch_size * float(positions.mean()))
    flat_len = flat_length(tc, max(stream.row_len, int(positions.max())), step_tokens)  # as the trainer sets it
    guard = FiniteGuard(device)

    def step(rows):
        return train_step(fwd, model, optimizer, data, rows, data.vocab.pad_id, tc, device, kind, guard, flat_len)

    t0 = time.perf_counter()
    for _ in range(warmup):
        step(stream.take(step_tokens))
    sync(device)
    warmup_s = time.perf_counter() - t0
    n_kernels = count_kernels(lambda: step(stream.take(step_tokens)), device) if kernels else None
    steps, tokens, timed_rows = 0, 0, []
    sync(device)
    t0 = time.perf_counter()
    while steps == 0 or time.perf_counter() - t0 < seconds:
        rows = stream.take(step_tokens)
        _, n_tok, _ = step(rows)
        steps, tokens = steps + 1, tokens + n_tok
        timed_rows += rows
    sync(device)
    dt = time.perf_counter() - t0
    guard.check()  # a benchmark of non-finite steps measures nothing
    flops, attention = useful_flops(model, data, timed_rows)
    return {"learner": learner, "preset": name, "params": model.num_params(include_positions=False), "attention": kind,
            "steps": steps, "step_tokens": step_tokens, "step_s": dt / steps, "tok_s": tokens / dt,
            "gflop_s": flops / dt / 1e9, "attention_share": attention / flops, "warmup_s": warmup_s,
            "padding": padding_fraction(timed_rows, positions), "dropped": dropped, "kernels": n_kernels,
            "flat_len": flat_len if kind == "flex" else None,
            "memory_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda, cuda:N")
    ap.add_argument("--preset", default=None, help="model preset (default: paper on CUDA, small on CPU)")
    ap.add_argument("--learners", "--views", dest="learners", default="rm,cot")  # --views: the old spelling
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per learner (default 30 CUDA, 10 CPU)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5 CUDA, 1 CPU)")
    ap.add_argument("--pool", type=int, default=2000, help="expressions sampled with seed 42")
    ap.add_argument("--batch-size", type=int, default=TrainConfig().batch_size)
    ap.add_argument("--micro-batch-tokens", type=int, default=None,
                    help="positions per forward pass (default 65536 on CUDA, the trainer's 16384 on CPU)")
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile (default: compile on CUDA)")
    ap.add_argument("--kernels", action="store_true", help="count one step's CUDA kernels with the profiler")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    if args.threads:
        torch.set_num_threads(args.threads)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = args.preset or ("paper" if cuda else "small")
    seconds = args.seconds if args.seconds is not None else (30.0 if cuda else 10.0)
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
    micro = args.micro_batch_tokens or (65536 if cuda else TrainConfig().micro_batch_tokens)
    compile_model = cuda and not args.no_compile
    tc = TrainConfig(batch_size=args.batch_size, micro_batch_tokens=micro, max_steps=1)
    print_facts()
    print(f"device {device}, preset {name}, micro-batches of {micro:,} positions, "
          f"{'compiled' if compile_model else 'eager'}, load average (1 min) {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cores")
    if cuda:
        check_flex_kernel(device)
    peak = matmul_peak(device)
    print(f"dense matmul peak: {peak:,.0f} GFLOP/s ({'bf16' if cuda else 'fp32'})")

    exprs = build_pool(args.pool, 42, workers=1, task=PAPER).column("expr").to_pylist()
    results = []
    with tempfile.TemporaryDirectory() as cache:
        for learner in args.learners.split(","):
            data = build_examples(exprs, learner, PAPER.vocab, workers=os.cpu_count() or 1, cache_dir=cache, task=PAPER)
            r = bench(learner, data, name, device, tc, compile_model, seconds, warmup, args.kernels)
            results.append(r)
            print(f"  {learner:3s} {r['params'] / 1e6:5.2f}M {r['attention']:6s} {r['step_s'] * 1e3:8.1f} ms/step "
                  f"{r['tok_s']:11,.0f} useful tok/s {r['gflop_s']:9,.0f} GFLOP/s  ({r['steps']} steps of "
                  f"{r['step_tokens']:,} positions, padding {r['padding']:.1%}, attention {r['attention_share']:.0%} "
                  f"of FLOPs, warm-up {r['warmup_s']:.0f}s, dropped {r['dropped']} too long"
                  + (f", micro-batch rows of {r['flat_len']:,}" if r["flat_len"] is not None else "")
                  + (f", {r['kernels']} kernels/step" if r["kernels"] is not None else "")
                  + (f", peak memory {r['memory_gb']:.1f} GB" if r["memory_gb"] is not None else "") + ")",
                  flush=True)
    print("| learner | preset | attention | ms/step | useful tok/s | useful GFLOP/s | MFU |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['learner']} | {r['preset']} | {r['attention']} | {r['step_s'] * 1e3:.1f} | {r['tok_s']:,.0f} | "
              f"{r['gflop_s']:,.0f} | {r['gflop_s'] / peak:.1%} |")


if __name__ == "__main__":
    main()

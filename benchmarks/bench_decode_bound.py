"""Where batched decoding's time goes, and the most any driver change could gain.

    python benchmarks/bench_decode_bound.py [--threads 1] [--batch 256] [--n 500]

The same runs as bench_infer.py's batch-256 row (`small` preset, random weights, teacher-forced
through the driver over IID-sized expressions), split three ways:

- **driver**: everything outside the model's forward (the driver's per-step bookkeeping, the
  oracle's lookup, the cache's parking and restoring of frames);
- **model, matrix products**: the self time of the GEMM kernels (`aten::addmm`, `aten::mm`,
  `aten::bmm`, and the fused attention kernel where torch picks it) inside the forward, from
  torch's profiler;
- **model, the rest**: every other op of the forward (norms, activations, softmax, indexing,
  cache writes, the launch overhead of each op).

The bound printed last is total / GEMM time: the speed-up a decoder would reach if it ran the
same matrix products and nothing else at all. A 3x goal above that bound needs a smaller amount
of arithmetic (another model or fewer tokens fed), not a faster driver.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from bench_infer import VOCAB, L, expression_set  # noqa: E402
from machine import print_facts  # noqa: E402

from rlmlab.decoding.driver import generate  # noqa: E402
from rlmlab.decoding.engine import ModelPredictor  # noqa: E402
from rlmlab.decoding.oracle import oracle_predictor  # noqa: E402
from rlmlab.decoding.predictor import TeacherForced  # noqa: E402
from rlmlab.learning.model import Transformer, preset  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

GEMM = ("aten::addmm", "aten::mm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu")


def decode(model, learner: str, exprs: list, batch: int) -> tuple[float, float, int, int]:
    """(CPU s of the whole decode, CPU s inside model.forward, tokens generated, tokens fed)."""
    inside = [0.0]
    started = []
    pre = model.register_forward_pre_hook(lambda *_: started.append(time.process_time()))
    post = model.register_forward_hook(lambda *_: inside.__setitem__(0, inside[0] + time.process_time()
                                                                       - started.pop()))
    try:
        predictor = TeacherForced(ModelPredictor(model), oracle_predictor(learner, VOCAB, library=PAPER.library))
        c0 = time.process_time()
        gens = generate(predictor, exprs, VOCAB, learner, batch_size=batch, library=PAPER.library)
        total = time.process_time() - c0
    finally:
        pre.remove()
        post.remove()
    return total, inside[0], sum(g.n_generated for g in gens), sum(g.fed for g in gens)


def gemm_seconds(model, learner: str, exprs: list, batch: int) -> float:
    """CPU seconds of the GEMM kernels (their self time) in a profiled decode of the same rows.

    The profiler slows the small ops around the kernels, hardly the kernels themselves, so this
    is measured apart from the unprofiled totals and set beside them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        decode(model, learner, exprs, batch)
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in GEMM) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--n", type=int, default=500, help="IID-sized expressions (trace length <= 197)")
    args = ap.parse_args()
    if args.threads < 1 or args.batch < 1 or args.n < 1:
        ap.error("--threads, --batch and --n must be positive")
    torch.set_num_threads(args.threads)
    print_facts()
    print(f"load average {os.getloadavg()[0]:.2f}, torch threads {torch.get_num_threads()}")
    exprs = expression_set(args.n, 1, L, 0)
    print("| learner | params | tokens (fed) | tok/s (CPU) | driver | model: GEMM | model: rest | bound |")
    print("|---|---|---|---|---|---|---|---|")
    for learner in ("cot", "rm"):
        torch.manual_seed(0)
        model = Transformer(preset("small", learner, len(VOCAB))).eval()
        with torch.no_grad():
            decode(model, learner, exprs[:32], args.batch)  # warm-up: allocator, first-call paths
            total, forward, tokens, fed = decode(model, learner, exprs, args.batch)
            gemm = gemm_seconds(model, learner, exprs, args.batch)
        print(f"| {learner} | {model.num_params():,} | {tokens:,} ({fed:,}) | {tokens / total:,.0f} | "
              f"{(total - forward) / total:.0%} | {gemm / total:.0%} | {(forward - gemm) / total:.0%} | "
              f"{total / gemm:.1f}x |", flush=True)


if __name__ == "__main__":
    main()

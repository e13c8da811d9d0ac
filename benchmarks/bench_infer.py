"""Inference speed: the CoT decoder and the RM stack driver on the `small` preset (random weights).

    python benchmarks/bench_infer.py [--threads N] [--quick]

A random-weight model stops at its first illegal token, so every run here is *teacher-forced
through the driver*: the model runs at every step (its KV cache, its forward passes) but the
oracle picks the token, so rows follow the canonical traces and have their true lengths.
The oracle's own cost (a table lookup per token) is included in every figure.

- decoded tokens/s at batch 1 and at batches 64 and 256 (continuous batching: a finished
  row's slot takes the next expression);
- the KV cache against recomputing every row's full prefix each step, at batch 64, over the
  first `--recompute-tokens` generated tokens of 64 expressions (recomputation grows with the
  prefix, so the ratio only grows on longer traces);
- expressions/s on two fixed sets: 500 IID-sized expressions (trace length <= 197, the
  CPU notes' length split) and 200 OOD-sized ones (1.5-3x that length).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from machine import print_facts  # noqa: E402

from rlmlab.decoding.driver import Limits, generate  # noqa: E402
from rlmlab.decoding.engine import ModelPredictor  # noqa: E402
from rlmlab.decoding.oracle import oracle_predictor  # noqa: E402
from rlmlab.decoding.predictor import TeacherForced  # noqa: E402
from rlmlab.learning.model import Transformer, preset  # noqa: E402
from rlmlab.task.sampler import ExpressionSampler  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

VOCAB = PAPER.vocab
L = 197  # the CPU notes' length threshold


def expression_set(n: int, lo: int, hi: int, seed: int) -> list:
    """The first n sampled expressions (paper generator, `seed`) with lo <= trace length <= hi."""
    sampler, rng, out = ExpressionSampler(library=PAPER.library), random.Random(seed), []
    while len(out) < n:
        e = sampler.sample(rng)
        if lo <= PAPER.trace_stats(e).trace_len <= hi:
            out.append(e)
    return out


def run(model, learner: str, exprs: list, batch: int, use_cache: bool = True, limits: Limits = Limits()) -> dict:
    predictor = TeacherForced(ModelPredictor(model, use_cache=use_cache), oracle_predictor(learner, VOCAB, library=PAPER.library))
    t0, c0 = time.perf_counter(), time.process_time()
    gens = generate(predictor, exprs, VOCAB, learner, limits, batch_size=batch, library=PAPER.library)
    s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(g.n_generated for g in gens)
    # CPU seconds hardly move when other jobs share the cores: compare checkouts with them.
    return {"s": s, "cpu_s": cpu_s, "tokens": tokens, "tok_s": tokens / s, "expr_s": len(exprs) / s,
            "fed": sum(g.fed for g in gens), "valid": sum(g.valid for g in gens)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recompute-tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="smaller sets (a smoke run, figures not comparable)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print_facts()
    print(f"load average {os.getloadavg()[0]:.2f}, torch threads {torch.get_num_threads()}")
    k = 5 if args.quick else 1
    iid = expression_set(500 // k, 1, L, args.seed)
    ood = expression_set(200 // k, int(1.5 * L), 3 * L, args.seed + 1)
    single = expression_set(4, int(1.5 * L), 3 * L, args.seed + 2)  # batch 1: four OOD-sized traces
    rows = []
    models = {}
    for learner in ("cot", "rm"):
        torch.manual_seed(0)
        models[learner] = Transformer(preset("small", learner, len(VOCAB))).eval()
    t_start = time.perf_counter()

    def report(what: str, learner: str, r: dict) -> None:
        rows.append((what, learner, r))
        print(f"{what:<44} {learner:<3}  {r['tok_s']:>8,.0f} tok/s  {r['expr_s']:>7.1f} expr/s  "
              f"{r['s']:>6.1f} s  {r['cpu_s']:>6.1f} CPU s  ({r['tokens']:,} tokens, fed {r['fed']:,}, "
              f"valid {r['valid']})", flush=True)

    for learner in ("cot", "rm"):
        report("batch 1, 4 OOD-sized traces", learner, run(models[learner], learner, single, 1))
    for learner in ("cot", "rm"):
        for batch in (64, 256):
            report(f"batch {batch}, {len(iid)} IID-sized (len <= {L})", learner,
                   run(models[learner], learner, iid, batch))
    for learner in ("cot", "rm"):
        report(f"batch 64, {len(ood)} OOD-sized ({int(1.5 * L)}-{3 * L})", learner,
               run(models[learner], learner, ood, 64))
    speedups = {}
    for learner in ("cot", "rm"):
        first = ood[:64]
        lim = Limits(max_new_tokens=args.recompute_tokens)
        cached = run(models[learner], learner, first, 64, True, lim)
        recomputed = run(models[learner], learner, first, 64, False, lim)
        report(f"batch 64, first {args.recompute_tokens} tokens, KV cache", learner, cached)
        report(f"batch 64, first {args.recompute_tokens} tokens, recompute", learner, recomputed)
        speedups[learner] = cached["tok_s"] / recomputed["tok_s"]
    for learner, x in speedups.items():
        print(f"KV cache speed-up over recomputation at batch 64 ({learner}): {x:.1f}x")
    by = {(w, v): r for w, v, r in rows}
    for w in {w for w, _, _ in rows if "expr" not in w and "first" not in w and "batch 1," not in w}:
        rm, cot = by[(w, "rm")], by[(w, "cot")]
        print(f"RM / CoT expressions/s, {w}: {rm['expr_s'] / cot['expr_s']:.2f}")
    print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()

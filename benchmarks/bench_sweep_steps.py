"""CPU seconds per training step of the `paper-cpu` learners at several thresholds, measured,
to check the step-cost model of `rlmlab run sweep --plan` (`rlmlab.experiments.sizing`).

For each threshold and learner: a random sample of the split's training expressions, the
learner's `paper-cpu` settings (batch, rows, model), `--steps` optimizer steps with the real
trainer on one thread; reports CPU seconds per step after the first `--skip` steps and the
positions those steps took, beside the plan's prediction. Rounds interleave the thresholds so
that a change in the machine's load hits every threshold alike; the plan's figures are relative
to L = 595, so compare ratios to the L = 595 row, not absolute seconds, on a loaded machine.

    python benchmarks/bench_sweep_steps.py --pool runs/length-595/data/pool-500000-s42.parquet \
        --lengths 595,1060,1839 --steps 30 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

from rlmlab.experiments.presets import get_preset  # noqa: E402
from rlmlab.experiments.run_job import train_run  # noqa: E402
from rlmlab.experiments.splits import threshold_split  # noqa: E402
from rlmlab.learning.config import RunConfig, apply_settings  # noqa: E402
from rlmlab.task.pool import read_pool  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def measure(train, val, view: str, steps: int, skip: int, work: Path) -> dict:
    import pyarrow.parquet as pq

    p = get_preset("paper-cpu")
    pq.write_table(train, work / "train.parquet")
    pq.write_table(val, work / "val.parquet")
    settings = {**p.job_settings(view), "data.learner": view, "data.train": str(work / "train.parquet"),
                "data.val": str(work / "val.parquet"), "data.cache_dir": "", "data.workers": 1,
                "train.threads": 1, "train.max_steps": steps, "train.eval_every": 10 * steps,
                "train.answer_eval": 0, "train.log_every": 1, "train.patience": None}
    run = work / f"run-{view}"
    train_run(apply_settings(RunConfig(), settings), run, progress=False)
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    tr = {r["step"]: r for r in recs if r.get("kind") == "train"}
    a, b = tr[skip], tr[steps]
    return {"cpu_s_per_step": (b["cpu_s"] - a["cpu_s"]) / (steps - skip),
            "positions_per_step": (b["tokens"] - a["tokens"]) / (steps - skip)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", required=True, help="the seed-42 pool of 500,000 (parquet)")
    ap.add_argument("--lengths", default="595,1060,1839")
    ap.add_argument("--depths", default="")
    ap.add_argument("--learners", "--views", dest="views", default="cot,rm")  # --views: the old spelling
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5, help="first steps left out (allocation, warm-up)")
    ap.add_argument("--sample", type=int, default=4000, help="training expressions sampled per threshold")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print_facts()
    p = get_preset("paper-cpu")
    pool = read_pool(args.pool, task=PAPER)
    wanted = [("length", int(t)) for t in args.lengths.split(",") if t] + \
             [("depth", int(t)) for t in args.depths.split(",") if t]
    splits = {}
    for kind, t in wanted:
        s = threshold_split(pool, kind, t, n_val=p.n_val, per_bin_cap=p.per_bin_cap)
        # A uniform sample of the whole training set: its prefixes lean to the frequent (short)
        # expressions, whose first copy comes early in the split's walk of the pool.
        n = min(args.sample, s.train.num_rows)
        pick = sorted(random.Random(f"bench:{kind}:{t}").sample(range(s.train.num_rows), n))
        splits[(kind, t)] = (s.train.take(pick), s.val.slice(0, 50))
    results: dict = {}
    for _ in range(args.rounds):
        for kind, t in wanted:
            for view in args.views.split(","):
                with tempfile.TemporaryDirectory() as d:
                    m = measure(*splits[(kind, t)], view, args.steps, args.skip, Path(d))
                results.setdefault((kind, t, view), []).append(m)
                print(f"{kind} {t} {view}: {m['cpu_s_per_step']:.3f} CPU s / step, "
                      f"{m['positions_per_step']:.0f} positions / step", flush=True)
    print("\n| split | threshold | learner | CPU s / step (best of rounds) | positions / step |\n|---|---|---|---|---|")
    for (kind, t, view), ms in results.items():
        best = min(ms, key=lambda m: m["cpu_s_per_step"])
        print(f"| {kind} | {t} | {view} | {best['cpu_s_per_step']:.3f} | {best['positions_per_step']:.0f} |")


if __name__ == "__main__":
    main()

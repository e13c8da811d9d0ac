"""The sweep plan's CPU estimates against the runs they planned: for every finished RM and CoT
run of a sweep folder, the CPU seconds per training step and the CPU hours that
`rlmlab run sweep --plan` predicts, beside what the run's `metrics.jsonl` and evaluation
summary recorded.

CPU seconds per step include validation on both sides, as the plan's reference runs do (the
trainer's `cpu_s` at its end over its steps); CPU hours add the evaluation's decoding. The
runs' own load is not recorded: two runs shared the machine's two cores, and other work came
and went.

    python benchmarks/bench_sweep_plan.py results/sweep-paper-cpu \
        --pool runs/sweep-paper-cpu/data/pool-500000-s42.parquet
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

from rlmlab.experiments.presets import get_preset  # noqa: E402
from rlmlab.experiments.sizing import size_sweep  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

LEARNERS = ("rm", "cot")  # the plan sizes the paper's two learners


def measured(run: Path) -> dict | None:
    """A finished run's CPU seconds per step and CPU hours with its evaluation; None for a
    learner not run at this threshold, or a run without an end record or an evaluation."""
    if not (run / "metrics.jsonl").is_file():
        return None
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    end = [r for r in recs if r.get("kind") == "end"]
    summaries = sorted((run / "eval").glob("*/summary.json"))
    if not end or not summaries:
        return None
    steps, cpu_s = end[-1]["step"], end[-1]["cpu_s"]
    decode_s = sum(json.loads(s.read_text())["seconds"] for s in summaries)
    return {"steps": steps, "cpu_s_per_step": cpu_s / steps, "cpu_hours": (cpu_s + decode_s) / 3600}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a sweep experiment folder (runs/ or results/)")
    ap.add_argument("--pool", required=True, help="the pool the sweep's splits were drawn from (parquet)")
    args = ap.parse_args()
    meta = json.loads((args.folder / "experiment.json").read_text())
    if meta.get("kind") != "sweep":
        sys.exit(f"{args.folder}: not a sweep folder (experiment kind {meta.get('kind')!r})")
    lengths = sorted(int(j.split("-")[1]) for j in meta["splits"] if j.startswith("length-"))
    depths = sorted(int(j.split("-")[1]) for j in meta["splits"] if j.startswith("depth-"))
    print_facts()
    preset = get_preset(meta["preset"]["name"])
    plan = size_sweep(preset, args.folder, LEARNERS, lengths=lengths, depths=depths, pool=args.pool, task=PAPER)
    print("| split | threshold | learner | steps | plan CPU s / step | measured | ratio | plan CPU h | measured |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in plan:
        for learner in LEARNERS:
            got = measured(args.folder / f"{row['split']}-{row['threshold']}" / learner)
            lv = row["learners"][learner]
            if got is None:
                continue
            # The plan's hours are for its step budget; a run stopped early by its patience is
            # compared at the steps it took.
            plan_h = (got["steps"] * lv["cpu_s_per_step"] + lv["decode_s"]) / 3600
            print(f"| {row['split']} | {row['threshold']} | {learner} | {got['steps']:,} | {lv['cpu_s_per_step']:.2f} | "
                  f"{got['cpu_s_per_step']:.2f} | {got['cpu_s_per_step'] / lv['cpu_s_per_step']:.2f} | "
                  f"{plan_h:.1f} | {got['cpu_hours']:.1f} |")


if __name__ == "__main__":
    main()

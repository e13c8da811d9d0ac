"""`rlmlab reproduce RESULTS`: check a committed results folder against a fresh run.

    rlmlab reproduce results/length-595-paper-cpu-steps --out runs/check             # re-run its stored commands
    rlmlab reproduce results/length-595-paper-cpu-steps --learners rm --sample 20    # one learner, 20 expressions a bin
    rlmlab reproduce results/length-595-paper-cpu-steps --checkpoints rlmlab/released/paper-cpu-length-595 --sample 40

Re-running trains from scratch with the stored commands (folder and learners replaced as
asked; --sample cuts what is decoded, never the split or the training) and reports the fresh
folder; with --checkpoints it only evaluates released
checkpoints on the committed evaluation expressions, and says how many got the committed
prediction and first divergence. Either way it prints every accuracy cell of the committed
report beside the fresh one and flags the cells that disagree: neither accuracy in the other's
95% interval (so a cell of a --sample is held to its own, wider interval). The table is also
written to <out>/reproduce.md. Runs budgeted in wall-clock minutes
(committed before budgets were in steps) are re-run under today's step presets: a
replication, not the same run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlmlab.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="check a committed results folder against a fresh run",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="a results folder (experiment.json, commands.jsonl, report/)")
    p.add_argument("--out", default=None, help="folder of the fresh run (default runs/reproduce/<name>)")
    p.add_argument("--views", dest="learners", default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # old spelling
    p.add_argument("--learners", dest="learners", default=None, metavar="LEARNERS",
                   help="only these learners, comma-separated (default: all stored)")
    p.add_argument("--sample", type=int, default=None,
                   help="decode only the first N expressions of each bin (of each set for the IID and shortcut "
                        "kinds); the split and the training stay as stored")
    p.add_argument("--checkpoints", default=None,
                   help="re-evaluate the checkpoints in this folder (<learner>/best/ or <job>/<learner>/best/) "
                        "instead of re-training")
    p.add_argument("--dry-run", action="store_true", help="print the commands a re-run would run, and stop")
    p.add_argument("--strict", action="store_true", help="exit with status 1 when a cell disagrees")
    p.set_defaults(handler=run)


def run(args) -> int:
    from rlmlab.experiments import reproduce as rp

    results = Path(args.results)
    if args.sample is not None and args.sample < 1:
        raise ConfigError("--sample must be at least 1")
    learners = [v.strip() for v in args.learners.split(",") if v.strip()] if args.learners else None
    out = Path(args.out) if args.out else Path("runs") / "reproduce" / results.resolve().name
    budgeted = rp.time_budgeted(results)
    if budgeted and args.checkpoints is None:
        print(f"note: {len(budgeted)} runs of {results} were trained under a wall-clock budget "
              f"({', '.join(budgeted[:4])}{', ...' if len(budgeted) > 4 else ''}); a re-run trains today's "
              "step budgets: a replication, not the same run")
    logs: dict[str, str] = {}  # per run, its training log against the committed one
    if args.checkpoints is not None:
        agreement = rp.reevaluate(results, Path(args.checkpoints), out, args.sample)
        for name, a in agreement.items():
            print(f"{name}: {a['same_prediction_and_divergence']} of {a['n']} expressions with the committed "
                  f"prediction and first divergence; correct: committed {a['committed_correct']}, "
                  f"fresh {a['fresh_correct']}")
    else:
        rp.rerun(results, out, args.run_command, learners, args.sample, dry_run=args.dry_run,
                 check_command=args.check_command)
        if args.dry_run:
            return 0
        logs = rp.compare_training_logs(results, out)
        for run_name, verdict in logs.items():
            print(f"{run_name}: {verdict}")
    checks, missing = rp.compare(results, out)
    table = rp.comparison_table(checks, missing)
    (out / "reproduce.md").write_text(table)
    (out / "reproduce.json").write_text(json.dumps(
        {"results": str(results), "cells": [{"cell": c.cell, "committed": c.committed, "fresh": c.fresh,
                                              "inside": c.inside} for c in checks], "missing": missing,
         "training_logs": logs}, indent=1) + "\n")
    print(table, end="")
    return 1 if args.strict and not all(c.inside for c in checks) else 0

"""`rlmlab train`: train a CoT or RM model on a pool of expressions.

    rlmlab train --learner rm --model small --data pool.parquet --out runs/rm-small --max-steps 3000
    rlmlab train --out runs/rm-small --resume --max-steps 3000      # continue after a stop, same settings
    rlmlab train --learner cot --recipe paper-cpu --data pool.parquet --out runs/cot   # a committed recipe

The learning rate warms up, then follows a cosine to its floor at the step budget (or at
--train.decay_steps): a function of the step alone, so a run is the same on any machine.
--minutes is a wall-clock limit that only stops the run (resumable; machine-dependent).

Settings: defaults (or --recipe's) < --config FILE (JSON or TOML) < --section.key=value < the
flags below. Every config field is also an option (`--train.lr=3e-4`, `--model.n_layer=4`, ...).
--recipe NAME starts from what `rlmlab run --preset NAME` trains this learner with on the length
and depth splits (model, batch, learning rate, schedule, step budget, validation).
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from rlmlab.errors import ConfigError
from rlmlab.experiments.presets import EXPERIMENT_PRESETS
from rlmlab.learning.config import (
    MODEL_PRESETS,
    OLD_KEYS,
    SECTIONS,
    RunConfig,
    apply_dict,
    apply_overrides,
    field_docs,
    load_config_file,
)
from rlmlab.learning.examples import PACKINGS
from rlmlab.safeio import refuse_other_folder

OVERRIDE = "override:"


def register(sub) -> None:
    p = sub.add_parser("train", help="train a CoT or RM model", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--view", dest="learner", default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # old spelling
    p.add_argument("--learner", metavar="LEARNER",
                   help="what the model reads and how it is trained to (data.learner; default rm): "
                   f"{', '.join(PACKINGS)}, or an observation function with its parameter: window:K (the last "
                   "K tokens), reduce (completed calls collapsed to their values)")
    p.add_argument("--model", choices=tuple(MODEL_PRESETS), help="model preset: the model's size, "
                   "the same for every learner (model.preset; default small)")
    p.add_argument("--preset", dest="model", choices=tuple(MODEL_PRESETS), default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # old spelling of --model
    p.add_argument("--recipe", choices=tuple(EXPERIMENT_PRESETS), help="start from the settings an experiment "
                   "preset (`rlmlab run --preset`) trains this learner with on the length and depth splits")
    p.add_argument("--data", metavar="PARQUET",
                   help="training expressions: a pool from `rlmlab data pool` (data.train)")
    p.add_argument("--val", metavar="PARQUET", help="validation expressions (data.val; default: split off --data)")
    p.add_argument("--out", required=True, metavar="DIR", help="run folder (checkpoints, metrics.jsonl)")
    p.add_argument("--config", metavar="FILE", help="JSON or TOML file with sections model, data, train")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--max-steps", type=int, help="step budget, the cosine's end (train.max_steps)")
    p.add_argument("--minutes", type=float, help="wall-clock limit: stops the run, never changes its schedule "
                   "(train.max_minutes; machine-dependent)")
    p.add_argument("--seed", type=int, help="train.seed")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--task", metavar="NAME|FILE", help="the task of the data (data.task; default paper): "
                   "a built-in name or a task file (docs/tasks.md)")
    for section, cls in SECTIONS.items():
        group = p.add_argument_group(f"{section} settings")
        docs = field_docs(cls)
        for f in fields(cls):
            text = f"{docs.get(f.name, '')} (default: {f.default!r})".replace("%", "%%")
            group.add_argument(f"--{section}.{f.name}", dest=f"{OVERRIDE}{section}.{f.name}", metavar="V",
                               default=argparse.SUPPRESS, help=text)
    for section, renamed in OLD_KEYS.items():  # old spellings (`--data.view`), still accepted
        for old in renamed:
            p.add_argument(f"--{section}.{old}", dest=f"{OVERRIDE}{section}.{old}", default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)
    p.set_defaults(handler=run)


def resolve_config(args, task=None) -> RunConfig:
    """Defaults (the resumed run's settings, or --recipe's) < config file < dotted overrides <
    flags. `task` is the `Task` that `--task` names, when the caller has resolved it already."""
    cfg = RunConfig()
    if args.recipe is not None:
        if args.resume:
            raise ConfigError("--recipe chooses a new run's settings; a resumed run keeps its own")
        cfg = recipe = recipe_config(args.recipe, args.learner or cfg.data.learner)
    if args.resume:
        from rlmlab.learning.checkpoint import checkpoint_dir, read_checkpoint_meta  # torch: not for `--help`

        ckpt = checkpoint_dir(args.out, "last")
        cfg = apply_dict(cfg, read_checkpoint_meta(ckpt)["config"], where=str(ckpt))
    if args.config:
        cfg = load_config_file(args.config, cfg)
    cfg = apply_overrides(cfg, {k[len(OVERRIDE):]: v for k, v in vars(args).items() if k.startswith(OVERRIDE)})
    spec = None
    if args.task is not None:  # recorded as a built-in name or an absolute path, checked before anything is written
        from rlmlab.task.taskfile import load_task

        spec = (task if task is not None else load_task(args.task)).spec
    flags = {"data": {"learner": args.learner, "train": args.data, "val": args.val, "task": spec},
             "model": {"preset": args.model},
             "train": {"max_steps": args.max_steps, "max_minutes": args.minutes, "seed": args.seed}}
    flags = {s: {k: v for k, v in d.items() if v is not None} for s, d in flags.items()}
    cfg = apply_dict(cfg, {s: d for s, d in flags.items() if d}, where="flags")
    if args.recipe is not None and cfg.data.learner != recipe.data.learner:
        raise ConfigError(f"--recipe {args.recipe} was taken for learner {recipe.data.learner}, but the settings "
                          f"train {cfg.data.learner}: give --learner {cfg.data.learner}")
    cfg.require_stop_rule()
    return cfg


def recipe_config(preset: str, learner: str) -> RunConfig:
    """What experiment preset `preset` trains `learner` with on a threshold split (its first
    seed), the data files left to the command: the same `ExperimentPreset.run_config` an
    experiment's jobs are built by."""
    base = RunConfig().data
    return EXPERIMENT_PRESETS[preset].run_config(learner, base.train, base.val)


def run(args) -> int:
    from rlmlab.experiments.run_job import train_run
    from rlmlab.task.taskfile import load_task

    refuse_other_folder(args.out, "training run", "--out", ConfigError)
    # The task is read once, here: what --task names, else what the config (or the resumed run) records.
    task = load_task(args.task) if args.task is not None else None
    cfg = resolve_config(args, task)
    task = task if task is not None else load_task(cfg.data.task)
    result = train_run(cfg, args.out, resume=args.resume, progress=not args.quiet, task=task)
    best = (f"best val {result.select_metric} {result.best_score:.4f} at step {result.best_step}"
            if result.best_score is not None else "no validation")
    print(f"stopped at step {result.step} ({result.stop_reason}); {best}; run folder {result.run_dir}")
    return 0

"""`rlmlab run iid|length|depth|sweep|shortcuts --preset NAME --out DIR`: one experiment, end to end.

Builds the data, trains both learners, evaluates them and writes per-expression results and
summaries; a re-run skips what is finished and resumes an interrupted training run, and with
--extend continues finished runs whose budget ran out to the larger budget it asks for.
`rlmlab report DIR` turns the saved results into the paper's tables and figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlmlab.errors import ConfigError
from rlmlab.experiments.kinds import RUNNABLE, get_kind
from rlmlab.experiments.presets import EXPERIMENT_PRESETS, ExperimentPreset, get_preset, settable_fields
from rlmlab.experiments.run import run_experiment
from rlmlab.learning.config import MAX_THREADS, field_docs
from rlmlab.learning.learner import PAPER_LEARNERS, get_learner
from rlmlab.safeio import refuse_other_folder

PRESET_SETTING = "preset:"
# Options that narrow what an experiment runs (or, --pool, what --plan sizes): comma-separated,
# default None, each read by the kinds it names.
SUBSET_OPTIONS = (
    ("--lengths", "sweep only: comma-separated length thresholds L (default, with no --depths: the paper's "
                  "33,96,197,359,595,1060,1345,1839); runs on different thresholds or learners may share --out"),
    ("--depths", "sweep only: comma-separated depth thresholds K (default, with no --lengths: the paper's "
                 "3,5,7,9,10)"),
    ("--pool", "with --plan: the pool parquet to size from (default: <out>/data's pool if built, else the "
               "preset's pool sampled in memory)"),
    ("--constructions", "shortcuts only: comma-separated constructions to run (default: the paper's six; also "
                        "hidden_literal_late, docs/experiments-data.md); runs on different subsets may share "
                        "--out (e.g. one per core)"),
    ("--sizes", "iid only: comma-separated training-set sizes N (default: the preset's); runs on different "
                "sizes or learners may share --out"),
    ("--seeds", "comma-separated training seed indices to run, 0 first: seed k trains with train.seed 1337+k on "
                "the same data and evaluation sets, in <job>-s<k>/ (seed 0 keeps <job>/). iid default: all the "
                "preset's (a size with fewer seeds runs those it has); length, depth, sweep, shortcuts default: 0"),
)


def register(sub) -> None:
    p = sub.add_parser("run", help="run one of the paper's experiments end to end", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("kind", choices=RUNNABLE, help="which experiment")
    p.add_argument("--preset", default="small", choices=tuple(EXPERIMENT_PRESETS), help="experiment preset: data "
                   "sizes, model preset, budgets and evaluation sizes (default small); `rlmlab train --recipe` "
                   "trains one of its runs")
    p.add_argument("--out", required=True, help="experiment folder (resumable)")
    p.add_argument("--threshold", type=int, default=None, help="length L or depth K (default: the preset's)")
    p.add_argument("--views", dest="learners", default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # old spelling
    p.add_argument("--learners", default=",".join(PAPER_LEARNERS), metavar="LEARNERS",
                   help="learners to run, comma-separated (default rm,cot; any learner of "
                        "`rlmlab train --learner`, e.g. rm,cot,rm-frames), each optionally with a position "
                        "encoding after @ (learned, none, rope, alibi; default: the paper's learned table), "
                        "e.g. rm,cot,cot@rope,cot@none (docs/positions.md)")
    p.add_argument("--plan", action="store_true",
                   help="sweep only: print the sizing of each threshold (training expressions and tokens per "
                        "epoch, widest frame and longest trace against the model's tables, decoding cost, CPU "
                        "hours at this command's step budgets) and exit without writing anything")
    for flag, text in SUBSET_OPTIONS:
        p.add_argument(flag, default=None, help=text)
    p.add_argument("--minutes", type=float, default=None,
                   help="wall-clock limit per learner (per run in the IID sweep): stops a run, leaving it "
                        "unfinished and resumable, and never changes its schedule; machine-dependent")
    p.add_argument("--max-steps", type=int, default=None,
                   help="override the step budget per learner (the end of its cosine)")
    p.add_argument("--extend", action="store_true",
                   help="continue finished runs whose budget ran out to the larger budget now asked for "
                        "(--max-steps; at the final learning rate of their cosine), and runs stopped on a "
                        "plateau when the patience now "
                        "asked for is larger or none; their evaluations, probes and frame tables move to "
                        "<run>/superseded-step<N>/ and the evaluations are redone")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per learner")
    p.add_argument("--ray-address", default=None, help="spread the jobs over this Ray cluster (default: local)")
    p.add_argument("--ray-gpus-per-job", type=float, default=None,
                   help="each job's share of a GPU on the Ray cluster (default 0.25 where the cluster has GPUs; "
                        "0: train on CPU)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--task", default=None, metavar="NAME|FILE",
                   help="the task: a built-in name or a task file (docs/tasks.md); default paper. Recorded "
                        "in experiment.json; a folder holds the experiment of one task")
    group = p.add_argument_group("preset settings", "any scalar field of the preset, over its value: "
                                 "--preset.NAME=VALUE (e.g. --preset.shortcut_max_trace=4096)")
    docs = field_docs(ExperimentPreset)
    for name in settable_fields():
        group.add_argument(f"--preset.{name}", dest=f"{PRESET_SETTING}{name}", metavar="V", default=argparse.SUPPRESS,
                           help=docs.get(name, "").replace("%", "%%"))
    p.add_argument("--learner-setting", action="append", default=[], metavar="TABLE.LEARNER.SECTION.KEY=V",
                   help="set one learner's entry of a per-learner table of the preset (per_learner, "
                        "shortcut_per_learner, iid_per_learner, iid_per_size.N: the IID runs from N training "
                        "expressions on), over --minutes/--max-steps; repeatable, e.g. "
                        "--learner-setting shortcut_per_learner.cot.train.batch_size=4")
    p.set_defaults(handler=run)


def _integers(flag: str, text: str | None, least: int) -> list[int] | None:
    """A comma-separated list of integers >= `least` given to `flag`, or None when not given."""
    if text is None:
        return None
    try:
        values = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < least:
        raise ConfigError(f"{flag}: expected integers of at least {least}, got {text!r}")
    return values


def run(args) -> int:
    names = tuple(v.strip() for v in args.learners.split(",") if v.strip())
    if not names:
        raise ConfigError("--learners: no learner given")
    for v in names:
        get_learner(v)  # one-line ConfigError naming an unknown learner or encoding
        if "/" in v:
            raise ConfigError(f"--learners: {v!r} cannot name a run folder")
    kind = get_kind(args.kind)
    for option in ("threshold", "constructions", "sizes", "seeds", "lengths", "depths"):
        if getattr(args, option) is not None and option not in kind.options:
            takes = [name for name in RUNNABLE if option in get_kind(name).options]
            raise ConfigError(f"--{option} applies to `rlmlab run {'|'.join(takes)}` only")
    constructions = None
    if args.constructions is not None:
        constructions = [c.strip() for c in args.constructions.split(",") if c.strip()]
        if not constructions:
            raise ConfigError("--constructions: no construction given")
    sizes = _integers("--sizes", args.sizes, least=1)
    lengths = _integers("--lengths", args.lengths, least=1)
    depths = _integers("--depths", args.depths, least=1)
    if (args.plan or args.pool is not None) and args.kind != "sweep":
        raise ConfigError("--plan and --pool apply to `rlmlab run sweep` only")
    if args.pool is not None and not args.plan:
        raise ConfigError("--pool applies with --plan only")
    seeds = _integers("--seeds", args.seeds, least=0)
    settings = {k[len(PRESET_SETTING):]: v for k, v in vars(args).items() if k.startswith(PRESET_SETTING)}
    preset = get_preset(args.preset).with_settings(settings)
    from rlmlab.task.taskfile import load_task

    # read once, here, and passed down: the plan, its data and every job use this object
    task = load_task(args.task if args.task is not None else preset.task)
    if args.task is not None:
        preset = preset.with_overrides(task=task.spec)  # checked before anything is written
    train = dict(preset.train)
    if args.ray_gpus_per_job is not None:
        if args.ray_address is None:
            raise ConfigError("--ray-gpus-per-job goes with --ray-address")
        if not 0 <= args.ray_gpus_per_job <= 1:
            raise ConfigError(f"--ray-gpus-per-job must lie in [0, 1], got {args.ray_gpus_per_job:g}")
    if args.threads is not None:
        if not 1 <= args.threads <= MAX_THREADS:
            raise ConfigError(f"--threads must lie in [1, {MAX_THREADS}], got {args.threads}")
        train["threads"] = args.threads
    preset = (preset.with_overrides(train=train).with_budget(args.minutes, args.max_steps)
              .with_learner_settings(args.learner_setting))
    out = Path(args.out)
    refuse_other_folder(out, "experiment", "--out", ConfigError)
    if args.plan:
        from rlmlab.experiments.sizing import plan_sweep

        print(plan_sweep(preset, out, names, lengths=lengths, depths=depths, pool=args.pool, progress=not args.quiet,
                         task=task))
        return 0

    def record(runs: list[str]) -> None:  # once the command is checked and planned: a refused one leaves no trace
        with open(out / "commands.jsonl", "a") as f:
            f.write(json.dumps({"argv": ["rlmlab", "run", args.kind, "--preset", args.preset, "--out", str(out)]
                                + [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                                   if k in ("threshold", "lengths", "depths", "learners", "constructions", "sizes",
                                            "seeds", "minutes", "max_steps", "threads", "ray_address",
                                            "ray_gpus_per_job", "task")
                                   and v is not None]
                                + [f"--preset.{k}={v}" for k, v in settings.items()]
                                + [f"--learner-setting={item}" for item in args.learner_setting]
                                + (["--extend"] if args.extend else []),
                                "runs": runs}) + "\n")
    run_experiment(args.kind, preset, out, threshold=args.threshold, learners=names, constructions=constructions,
                   lengths=lengths, depths=depths, sizes=sizes, seeds=seeds, ray_address=args.ray_address,
                   progress=not args.quiet, extend=args.extend, ray_gpus=args.ray_gpus_per_job, on_planned=record,
                   task=task)
    return 0

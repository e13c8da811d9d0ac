"""`rlmlab demo`: the README's main job: RM vs CoT on the paper's length split, in minutes.

It rebuilds the seed-42 pool and the paper-cpu preset's length split (the paper's L = 595
and bins), evaluates the checkpoints released with the project (trained by `rlmlab run length
--preset paper-cpu`, RM at 99.7% and CoT at 100.0% validation accuracy) on a few expressions per
bin, and prints the per-bin table and plot. `--retrain` trains both learners from scratch
instead (the preset's step budgets: RM 6,000 steps, about 50 minutes of one core, CoT 24,000,
about two hours).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.runlog import metrics_file

PRESET = "paper-cpu"
RELEASED = Path(__file__).resolve().parent.parent / "released" / "paper-cpu-length-595"


def register(sub) -> None:
    p = sub.add_parser("demo", help="RM vs CoT on the paper's length split with the released checkpoints "
                       "(a few minutes)", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--per-bin", type=int, default=40, help="evaluation expressions per bin (default 40)")
    p.add_argument("--retrain", action="store_true", help=f"train both learners from scratch ({PRESET} preset)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=run)


def run(args) -> int:
    from rlmlab.experiments.presets import get_preset
    from rlmlab.experiments.report import report
    from rlmlab.experiments.run import run_experiment

    out = Path(args.out)
    preset = get_preset(PRESET)
    if args.retrain:
        run_experiment("length", preset, out, learners=("rm", "cot"), progress=not args.quiet)
    else:
        if not (RELEASED / "rm" / "best" / "checkpoint.json").exists():
            raise DataError(f"no released checkpoints in {RELEASED}; run `rlmlab demo --retrain`")
        if args.per_bin < 1:
            raise DataError("--per-bin must be at least 1")
        _install_released(out, preset.length)
        run_experiment("length", preset.with_overrides(per_bin_cap=args.per_bin), out, progress=not args.quiet)
    dest = report(out)
    print((dest / f"table-length-{preset.length}.md").read_text())
    print(f"plot: {dest / f'bins-length-{preset.length}.png'}")
    return 0


def _install_released(out: Path, threshold: int) -> None:
    """Place the released checkpoints as finished runs of the experiment folder, so the
    experiment runner only evaluates them."""
    import shutil

    for learner in ("rm", "cot"):
        run_dir = out / f"length-{threshold}" / learner
        if (run_dir / "done.json").exists():
            continue
        (run_dir / "best").mkdir(parents=True, exist_ok=True)
        for name in ("checkpoint.json", "model.safetensors"):
            shutil.copy(RELEASED / learner / "best" / name, run_dir / "best" / name)
        log = metrics_file(RELEASED / learner)
        if log is not None:
            shutil.copy(log, run_dir / log.name)
        step = json.loads((RELEASED / learner / "best" / "checkpoint.json").read_text())["step"]
        (run_dir / "done.json").write_text(json.dumps({"step": step, "stop_reason": "released",
                                                       "released": str(RELEASED / learner)}) + "\n")

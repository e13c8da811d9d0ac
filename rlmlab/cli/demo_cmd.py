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
import os
import sys
from pathlib import Path

from rlmlab.errors import ConfigError, DataError
from rlmlab.learning.config import MAX_THREADS
from rlmlab.runlog import metrics_file

PRESET = "paper-cpu"
RELEASED = Path(__file__).resolve().parent.parent / "released" / "paper-cpu-length-595"


def register(sub) -> None:
    p = sub.add_parser("demo", help="RM vs CoT on the paper's length split with the released checkpoints "
                       "(a few minutes)", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--per-bin", type=int, default=40, help="evaluation expressions per bin (default 40)")
    p.add_argument("--retrain", action="store_true", help=f"train both learners from scratch ({PRESET} preset)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: the cores the last minute's load leaves idle, at least 1)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=run)


def idle_cores(cores: int, load: float | None) -> int:
    """The CPU cores a 1-minute load average of `load` leaves free, at least 1 (all of them
    where the system keeps no load average). A torch thread on a core another process holds
    waits for it at every operation: on a 2-core machine with one training running, two
    threads decode several times slower than one."""
    return cores if load is None else max(1, min(cores, round(cores - load)))


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def run(args) -> int:
    from rlmlab.experiments.presets import get_preset
    from rlmlab.experiments.report import report
    from rlmlab.experiments.run import run_experiment

    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise ConfigError(f"--threads must lie in [1, {MAX_THREADS}], got {args.threads}")
    if args.per_bin < 1:
        raise DataError("--per-bin must be at least 1")
    import torch

    cores, load = os.cpu_count() or 1, _load()
    threads = args.threads or idle_cores(cores, load)
    torch.set_num_threads(threads)
    if args.threads is None and not args.quiet:
        seen = "" if load is None else f"load {load:.1f} on "
        print(f"demo: {threads} torch thread{'s' * (threads > 1)} ({seen}{cores} cores; --threads N to choose)",
              file=sys.stderr)
    out = Path(args.out)
    preset = get_preset(PRESET)
    if args.retrain:
        run_experiment("length", preset, out, learners=("rm", "cot"), progress=not args.quiet)
    else:
        if not (RELEASED / "rm" / "best" / "checkpoint.json").exists():
            raise DataError(f"no released checkpoints in {RELEASED}; run `rlmlab demo --retrain`")
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

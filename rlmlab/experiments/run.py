"""`run_experiment`: one experiment of any kind, end to end (data, training, evaluation)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rlmlab.errors import ConfigError
from rlmlab.experiments.folder import folder_lock, refuse_another_experiment, refuse_busy
from rlmlab.experiments.job import Job
from rlmlab.experiments.kinds import KINDS, RUNNABLE, get_kind
from rlmlab.experiments.presets import ExperimentPreset, get_preset
from rlmlab.experiments.run_job import BUSY_RUN, run_job
from rlmlab.experiments.splits import sample_eval_file
from rlmlab.learning.learner import PAPER_LEARNERS
from rlmlab.task.taskfile import load_task


def run_jobs(jobs: list[Job], out: Path, ray_address: str | None = None, progress: bool = True,
             extend: bool = False, ray_gpus: float | None = None, task=None) -> list[dict]:
    """Run jobs locally in order, or spread them over a Ray cluster (`cluster.run_on_ray`, each
    job taking `ray_gpus` of a GPU there). `task`: the jobs' task, resolved by the caller (None:
    each job resolves its own `data.task`)."""
    if ray_address is None:
        return [run_job(j, out, progress, extend, task) for j in jobs]
    from rlmlab.experiments.cluster import run_on_ray

    return run_on_ray(jobs, out, ray_address, extend, ray_gpus, task)


def _identity_of(meta: dict) -> dict:
    """The identity of the experiment an experiment.json describes (of an unknown kind: its kind)."""
    kind = KINDS.get(meta["kind"])
    return kind.identity(meta) if kind is not None else {"kind": meta["kind"]}


def run_experiment(kind: str, preset: str | ExperimentPreset, out: str | Path, *, learners=PAPER_LEARNERS,
                   ray_address: str | None = None, progress: bool = True, extend: bool = False,
                   ray_gpus: float | None = None, on_planned: Callable[[list[str]], None] | None = None,
                   task=None, **options) -> list[Job]:
    """Build the data, train the learners `learners`, evaluate; resumable. Returns the jobs it ran.

    `options` are the kind's own (`ExperimentKind.options`): `threshold` for length and depth
    (default: the preset's), `sizes` and `seeds` for the IID sweep (default: the preset's),
    `constructions` for the shortcuts (default: all six); an option left None takes its default. `extend`
    continues finished runs to a larger budget. `on_planned` is called once the
    experiment is planned, before any job runs, with the run folders it planned (relative to
    `out`; `rlmlab run` records the command and its runs then). `task`
    is the preset's task as the command resolved it (None: resolved here); the plan, its data
    and every job use this one object."""
    if kind not in RUNNABLE:
        raise ConfigError(f"unknown experiment {kind!r} (have: {', '.join(RUNNABLE)})")
    experiment = get_kind(kind)
    options = {k: v for k, v in options.items() if v is not None}
    foreign = sorted(set(options) - set(experiment.options))
    if foreign:
        raise ConfigError(f"{', '.join(foreign)}: not an option of the {kind} experiment "
                          f"(it takes: {', '.join(experiment.options) or 'none'})")
    p = preset if isinstance(preset, ExperimentPreset) else get_preset(preset)
    task = task if task is not None else load_task(p.task)
    out = Path(out)
    if ray_address is not None:
        from rlmlab.experiments.cluster import check_address

        check_address(ray_address)
    t0 = time.perf_counter()
    # Runs sharing the folder build its data and rewrite experiment.json one at a time.
    with folder_lock(out, busy="another run is building data or recording its plan here"):
        # before any data is built
        refuse_another_experiment(out, experiment.planned_identity(p, task=task, **options), _identity_of)
        jobs = experiment.plan(p, out, tuple(learners), progress, task=task, **options)
        if p.eval_sample is not None:  # the split is built whole; only what is decoded is cut
            jobs = [replace(j, evals={name: str(sample_eval_file(path, p.eval_sample)) for name, path in j.evals.items()})
                    for j in jobs]
        for job in jobs:  # refused now, before the command is recorded, rather than when its turn comes
            refuse_busy(job.run_dir(out), BUSY_RUN)
        if on_planned is not None:
            on_planned([job.run_dir(out).relative_to(out).as_posix() for job in jobs])
    run_jobs(jobs, out, ray_address, progress, extend, ray_gpus, task)
    print(f"{kind}: {len(jobs)} jobs done in {time.perf_counter() - t0:.0f}s; tables: rlmlab report {out}")
    return jobs

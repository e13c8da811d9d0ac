"""An experiment's jobs as Ray tasks: `rlmlab run --ray-address` (docs/distributed.md).

The experiment folder (`--out`) lives on a filesystem that every node mounts at the same path.
The driver builds the data there before dispatching; each task runs `run_job` on a node, in the
driver's working directory, and writes only its own `<job>/<learner>/` folder; Ray carries nothing
but the job's description out and its evaluation summaries back. So a cluster run leaves the
very files of a local run, and resumes the same way, on the cluster or locally: a re-run of the
command skips what is done and continues the rest from their `last` checkpoints.

A task reserves `train.threads` CPUs of its node (1 when unset) and torch, and the processes
that build a job's examples, use that many, so a node runs as many jobs at once as its CPUs
allow. On a cluster with GPUs a task also reserves a share of one (`gpus_per_job`, by default
`GPU_SHARE`: four of the paper's small models train on one device at once) and trains on it,
as Ray hides every other GPU from it; a job set to train.device=cpu, or a share of 0, reserves
none and, with no GPU visible, trains on CPU. A task whose worker process or node dies is started again (`LOST_WORKER_RETRIES`) and
resumes from `last`. A job that fails stops the others: they save `last` as on Ctrl-C, and the
failure reaches the user as the job's own one-line error.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import replace
from pathlib import Path

from rlmlab.errors import ConfigError, DataError, RlmlabError
from rlmlab.experiments.job import Job

GPU_SHARE = 0.25
"""A job's share of one GPU on a cluster with GPUs, unless `--ray-gpus-per-job` says otherwise."""

LOST_WORKER_RETRIES = 3
"""Times Ray starts a job again after its worker process or node died (its own errors are final)."""

STOP_GRACE_S = 120
"""How long the jobs stopped after a failure or a Ctrl-C get to finish their step and save `last`."""

CONNECT_TIMEOUT_S = 10
"""How long the head's port may take to answer before the address is called unreachable (Ray
itself retries for minutes)."""


class ClusterError(RlmlabError):
    """A Ray cluster that cannot be reached, or that lost a job's worker more often than it retries."""


def run_on_ray(jobs: list[Job], out: str | Path, address: str, extend: bool = False,
               gpus_per_job: float | None = None, task=None) -> list[dict]:
    """Run `jobs` as tasks of the Ray cluster at `address` (host:port of its head, "auto", or a
    ray:// client address) and return each job's {set: summary}, in the order of `jobs`.

    Each task works in this process's working directory, so that relative paths name the same
    files as here, and a run's recorded data paths stay those of a local run of the command
    (a resumed run must train on the paths it started with). `gpus_per_job`: each job's share
    of a GPU (default: `GPU_SHARE` when the cluster has GPUs, else none). `task`, the jobs'
    resolved task, travels with each (None: each job resolves its own `data.task` on its node)."""
    if gpus_per_job is not None and not 0 <= gpus_per_job <= 1:
        raise ConfigError(f"--ray-gpus-per-job must lie in [0, 1], got {gpus_per_job}")
    ray = check_address(address)
    cwd = os.getcwd()
    jobs = [_with_threads(job) for job in jobs]
    if not sys.stderr.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # the workers' lines reach a log: no escape codes
    connected_here = not ray.is_initialized()
    if connected_here:
        _connect(ray, address)
    try:
        share = _gpu_share(ray, gpus_per_job)
        _refuse_unschedulable(ray, jobs, share)
        on_node = ray.remote(max_retries=LOST_WORKER_RETRIES, retry_exceptions=False)(_run_on_node)
        refs = [on_node.options(num_cpus=_threads(job), num_gpus=_gpus(job, share),
                             name=f"{job.name}/{job.learner}").remote(job, str(out), extend, cwd, task)
                for job in jobs]
        print(f"{len(jobs)} jobs on the Ray cluster at {address}: {_describe(ray)}", file=sys.stderr)
        return _gather(ray, refs, jobs)
    finally:
        if connected_here:
            ray.shutdown()


def _with_threads(job: Job) -> Job:
    """`job` with an explicit thread count: torch, and the example builder's process pool, would
    otherwise take every core of the node for each task."""
    cfg = job.config
    threads = cfg.train.threads or 1
    return replace(job, config=replace(cfg, train=replace(cfg.train, threads=threads),
                                       data=replace(cfg.data, workers=cfg.data.workers or threads)))


def _threads(job: Job) -> int:
    return job.config.train.threads


def _gpu_share(ray, gpus_per_job: float | None) -> float:
    """Each GPU job's share of a device: as asked, else GPU_SHARE where the cluster has GPUs."""
    if gpus_per_job is not None:
        return gpus_per_job
    return GPU_SHARE if _largest(ray, "GPU") > 0 else 0.0


def _gpus(job: Job, share: float) -> float:
    """The GPU share a job's task reserves: none for a job set to train on CPU."""
    return 0.0 if job.config.train.device == "cpu" else share


def _largest(ray, resource: str) -> float:
    return max((node["Resources"].get(resource, 0) for node in ray.nodes() if node["Alive"]), default=0)


def _run_on_node(job: Job, out: str, extend: bool, cwd: str, task=None) -> dict:
    """The Ray task: `run_job` on whichever node Ray chose, in the driver's working directory."""
    from rlmlab.experiments.run_job import run_job

    missing = [path for path in (Path(cwd, p) for p in (out, *job.data_files))
               if not path.exists()]
    if missing:
        raise DataError(f"{missing[0]}: not found on Ray node {socket.gethostname()}; --out must be on a "
                        "filesystem that every node mounts at the same path")
    worker_cwd = os.getcwd()
    if Path(cwd).is_dir():  # needed for relative paths only, which were found there
        os.chdir(cwd)
    try:
        return run_job(job, out, progress=False, extend=extend, task=task)
    finally:
        os.chdir(worker_cwd)


def check_address(address: str):
    """Ray, once it is known to be installed and a head to answer at `address` (host:port): an
    experiment checks this before it builds its data."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray-address needs Ray: pip install 'rlmlab[ray]'") from None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as e:
            raise ClusterError(f"--ray-address {address}: no Ray head answers there ({e.strerror or e}); "
                               "start one with `ray start --head`") from None
    return ray


def _connect(ray, address: str) -> None:
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as e:  # RuntimeError: Ray or Python versions differ
        raise ClusterError(f"--ray-address {address}: {' '.join(str(e).split()) or type(e).__name__}") from None


def _refuse_unschedulable(ray, jobs: list[Job], share: float = 0.0) -> None:
    """A task that asks for more CPUs or GPUs than any node has would wait forever: refuse it now."""
    largest = _largest(ray, "CPU")
    too_big = max(_threads(job) for job in jobs) if jobs else 0
    if too_big > largest:
        raise ConfigError(f"a job asks for {too_big} threads (--threads) but the largest node of the Ray "
                          f"cluster has {largest:g} CPUs")
    if any(_gpus(job, share) for job in jobs) and _largest(ray, "GPU") < share:
        raise ConfigError(f"the jobs ask for {share:g} of a GPU each (--ray-gpus-per-job) but no node of the "
                          "Ray cluster has a GPU")


def _describe(ray) -> str:
    nodes = [node for node in ray.nodes() if node["Alive"]]
    cpus = sum(node["Resources"].get("CPU", 0) for node in nodes)
    gpus = sum(node["Resources"].get("GPU", 0) for node in nodes)
    return f"{len(nodes)} node{'s' * (len(nodes) != 1)}, {cpus:g} CPUs" + (f", {gpus:g} GPUs" if gpus else "")


def _gather(ray, refs: list, jobs: list[Job]) -> list[dict]:
    """The jobs' results as they finish; the first failure stops the jobs still running."""
    from ray.exceptions import RayError, RayTaskError

    job_of = {ref: job for ref, job in zip(refs, jobs)}
    results = {}
    pending = list(refs)
    try:
        while pending:
            [ref], pending = ray.wait(pending, num_returns=1)
            job = job_of[ref]
            try:
                results[ref] = ray.get(ref)
            except RayTaskError as e:
                print(f"{job.name}/{job.learner} failed" + ("; stopping the other jobs" if pending else ""),
                      file=sys.stderr)
                _stop(ray, pending)
                if isinstance(e.cause, (RlmlabError, OSError)):
                    raise e.cause from None  # the job's own one-line error; its traceback is no news
                raise
            except RayError as e:  # the worker or node died once more than Ray restarts it
                _stop(ray, pending)
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ClusterError(f"{job.name}/{job.learner}: {reason} (restarted up to {LOST_WORKER_RETRIES} times); "
                                   "run the same command again to resume it from its last checkpoint") from None
            print(f"{job.name}/{job.learner}: done ({len(results)}/{len(refs)})", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupt: stopping the jobs; each saves its last checkpoint", file=sys.stderr)
        _stop(ray, pending)
        raise
    return [results[ref] for ref in refs]


def _stop(ray, pending: list) -> None:
    """Cancel running jobs the way Ctrl-C stops a local one (finish the step, save `last`), and
    wait for them to do it."""
    for ref in pending:
        ray.cancel(ref)
    if pending:
        ray.wait(pending, num_returns=len(pending), timeout=STOP_GRACE_S)

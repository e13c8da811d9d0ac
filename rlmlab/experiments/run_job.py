"""Running one job (`rlmlab.experiments.job.Job`): train one learner on one data set, then
evaluate it on the experiment's evaluation sets, in its own folder `<experiment>/<job>/<learner>/`.
It skips what is already there (a finished run has `done.json`; an evaluation `results.parquet`
+ `summary.json`), so re-running an experiment resumes it. Jobs run one after another here, or
on a Ray cluster.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rlmlab.errors import DataError
from rlmlab.experiments.job import Job
from rlmlab.learning.config import read_run_config
from rlmlab.safeio import read_json

if TYPE_CHECKING:
    from rlmlab.learning.config import TrainConfig

# Columns of an evaluation file that each result carries (bins, OOD flags, signals, pool ids).
RESULT_COLUMNS = ("id", "bin", "bin_index", "ood", "ratio", "within_tmax", "signal")

# What a finished run's outputs are, besides its checkpoints: all describe its best checkpoint.
RUN_OUTPUTS = ("done.json", "eval", "probe", "frames")


def reopen_to_extend(run_dir: Path, asked: "TrainConfig") -> str | None:
    """Reopen a finished run when the `asked` training settings now allow it more: a larger time or step budget
    than the one that ran out, or a larger patience (or none) than the one that stopped it on a
    plateau. Its outputs (done.json, evaluations, probes, frame tables) move to
    `superseded-step<N>/` in the run folder, so that the run resumes from `last` and is evaluated
    afresh. Returns why it stays finished, or None when it was reopened.

    A run's learning-rate schedule is fixed when it starts, so after a larger step budget the
    run goes on at the rate its cosine ended with; it is not the run a larger budget would have
    made from the start. After a plateau stop the budget and its schedule are unchanged, so the
    run goes on as the new patience would have let it."""
    try:
        done = read_json(run_dir / "done.json", what="done.json")
        saved = read_run_config(run_dir, DataError).train
        reason = done.get("stop_reason")
    except (DataError, AttributeError):
        raise DataError(f"{run_dir}: done.json or config.json is not what `rlmlab run` writes") from None
    if reason == "plateau":
        patience = asked.patience
        if patience is not None and (saved.patience is None or patience <= saved.patience):
            return f"it stopped on patience={saved.patience} and the patience asked for now is {patience}"
    elif reason in ("max_minutes", "max_steps"):
        budget, before = getattr(asked, reason), getattr(saved, reason)
        if budget is None or before is None or budget <= before:
            return f"it ran out of {reason}={before} and the budget asked for now is {reason}={budget}"
    else:
        return f"it stopped on {reason}, not on its budget or patience"
    keep = run_dir / f"superseded-step{done.get('step')}"
    if keep.exists():
        raise DataError(f"{keep} exists already: move it away to extend {run_dir} again from that step")
    _check_resumable(run_dir)  # before anything moves: a run that cannot resume stays finished as it was
    keep.mkdir()
    for name in RUN_OUTPUTS:
        if (run_dir / name).exists():
            (run_dir / name).rename(keep / name)
    return None


def _check_resumable(run_dir: Path) -> None:
    """The run's `last` checkpoint is complete and carries the state to resume from (its
    metadata digest and tensor files checked), or CheckpointError."""
    from rlmlab.errors import CheckpointError
    from rlmlab.learning.checkpoint import checkpoint_dir, read_checkpoint_meta
    from rlmlab.learning.resume import TrainerState
    from rlmlab.runlog import check_log

    ckpt = checkpoint_dir(run_dir, "last")
    meta = read_checkpoint_meta(ckpt)
    if "trainer" not in meta or "optimizer" not in meta:
        raise CheckpointError(f"{ckpt}: no trainer or optimizer state to resume from")
    TrainerState.from_saved({k: v for k, v in meta["trainer"].items() if k != "rng"}, ckpt)
    check_log(run_dir, resume=True)  # the log the resumed run goes on with


def train_run(cfg, run_dir: str | Path, resume: bool = False, progress: bool = True, task=None):
    """Train one run from its `RunConfig` (`rlmlab train` and every job): build its examples,
    validate by decoding `train.answer_eval` validation expressions, train or resume. `task` is
    `cfg.data.task` as the command resolved it (None: resolved here, once for all three steps).
    Returns `rlmlab.learning.train.TrainResult`."""
    from rlmlab.learning.data import prepare_data
    from rlmlab.learning.train import train
    from rlmlab.measuring.score import answer_accuracy_fn
    from rlmlab.task.taskfile import load_task

    task = task if task is not None else load_task(cfg.data.task)
    split = prepare_data(cfg.data, task, cfg.model.position_index)
    validate_fn = (answer_accuracy_fn(split.val_exprs[:cfg.train.answer_eval], task=task)
                   if cfg.train.answer_eval else None)
    return train(cfg, split.train, split.val, run_dir, task=task, resume=resume, validate_fn=validate_fn,
                 progress=progress)


BUSY_RUN = "another process is training or evaluating this run"


def run_job(job: Job, out: str | Path, progress: bool = True, extend: bool = False, task=None) -> dict:
    """Train (or resume, or skip when done) and evaluate; returns {set: summary}. With `extend`, a
    finished run continues when the job now asks for a larger budget than the one it ran out
    of, or a larger patience (or none) than the one that stopped it (`reopen_to_extend`). A run
    that another process holds (`rlmlab run` on the same folder, learners and subset twice) is
    refused rather than trained twice at once. `task` is the job's `data.task` as the command
    resolved it (None: resolved here; a job that names none evaluates on its checkpoint's task)."""
    from rlmlab.experiments.folder import folder_lock
    from rlmlab.task.taskfile import load_task

    if task is None and job.config is not None:
        task = load_task(job.config.data.task)
    with folder_lock(job.run_dir(Path(out)), wait=False, busy=BUSY_RUN):
        return _run_job(job, Path(out), progress, extend, task)


def _run_job(job: Job, out: Path, progress: bool, extend: bool, task) -> dict:
    from rlmlab.decoding.driver import Limits
    from rlmlab.decoding.engine import ModelPredictor
    from rlmlab.learning.checkpoint import has_checkpoint, load_run
    from rlmlab.learning.learner import get_learner
    from rlmlab.learning.step import resolve_device
    from rlmlab.measuring.result_files import eval_dir, find_eval_dir
    from rlmlab.measuring.score import evaluate_file

    run_dir = job.run_dir(out)
    done = run_dir / "done.json"
    if done.exists() and not finished_marker(done):
        print(f"{done}: not a finished-run marker; the run is resumed and evaluated again", file=sys.stderr)
        done.unlink()
    if extend and done.exists() and job.config is not None:
        stays = reopen_to_extend(run_dir, job.config.train)
        print(f"{run_dir}: " + (f"not extended: {stays}" if stays else "extended; earlier outputs moved to "
                                "superseded-step*/"), file=sys.stderr)
    cfg = job.config
    if not done.exists():
        if cfg is None:
            raise DataError(f"{run_dir}: not a finished run (no done.json) and no run configuration to train it with")
        cfg.require_stop_rule()
        result = train_run(cfg, run_dir, resume=has_checkpoint(run_dir, "last"), progress=progress,
                           task=task)
        if result.stop_reason == "interrupted":
            # Ctrl-C saved `last`; the run is unfinished, so neither mark it done (a re-run would
            # skip it) nor evaluate a half-trained model. The re-run resumes from `last`.
            raise KeyboardInterrupt
        if result.stop_reason == "time_limit":
            print(f"{run_dir}: stopped by its wall-clock limit at step {result.step} of "
                  f"{cfg.train.max_steps}; not evaluated. Run again with a larger --minutes (or none) "
                  "to continue the same run", file=sys.stderr)
            return {}
        done.write_text(json.dumps({"step": result.step, "stop_reason": result.stop_reason,
                                    "select_metric": result.select_metric, "best_score": result.best_score,
                                    "best_step": result.best_step}, indent=2) + "\n")
    threads = cfg.train.threads if cfg is not None else None
    if threads:  # train() sets them, but a finished or time-limited run evaluates without training
        import torch
        torch.set_num_threads(threads)
    summaries = {}
    loaded = None
    limits = Limits() if job.runaway_factor is None else Limits(runaway_factor=job.runaway_factor)
    for set_name, path in job.evals.items():
        found = find_eval_dir(run_dir, set_name)  # one in the old layout (eval/eval/) counts too
        saved = _evaluated(found)
        if saved is not None and Path(str(saved.get("data", ""))).name == Path(path).name:
            summaries[set_name] = saved
            continue
        if saved is not None:  # e.g. a sample (`--preset.eval_sample`) where the whole set is asked now
            print(f"{found}: evaluated on {saved.get('data')}, not {path}; evaluating again", file=sys.stderr)
        # Decode where the model trained: a CUDA run evaluates on the GPU too.
        loaded = loaded or load_run(run_dir, "best", resolve_device(cfg.train.device if cfg else "auto"),
                                    cfg.model.positions if cfg else get_learner(job.learner).encoding or "learned",
                                    task=task)
        # Inexact traces are kept so that `rlmlab view` can show what the model wrote where it erred.
        bar = _eval_bar(progress, f"eval {job.learner}" + ("" if set_name == "eval" else f" {set_name}"), path)
        try:
            _, summaries[set_name] = evaluate_file(
                eval_dir(run_dir, set_name), ModelPredictor(loaded.model), job.learner, path, loaded.vocab,
                model=loaded.model, limits=limits, batch_size=job.eval_batch, columns=RESULT_COLUMNS,
                traces="inexact", progress=None if bar is None else bar.update,
                header={"predictor": "model", "run_dir": str(run_dir), "which": "best", "step": loaded.step,
                        "set": set_name},
                task=loaded.task)
        finally:
            if bar is not None:
                bar.close()
    return summaries


def _eval_bar(progress: bool, name: str, data: str | Path):
    """A bar of the expressions decoded (their rate and the time left) on stderr, or None when
    `progress` is off or stderr is not a terminal, so that logs hold no bar. An evaluation is
    the longest silent stage of a finished run (minutes per learner on a CPU)."""
    if not progress or sys.stderr is None or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    total = None
    if str(data).endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            total = pq.ParquetFile(data).metadata.num_rows
        except (OSError, ValueError):  # unreadable: evaluate_file says why; the bar goes without a total
            pass
    return tqdm(total=total, desc=name, unit="expr", dynamic_ncols=True)


def finished_marker(done: Path) -> bool:
    """Whether `done.json` is the marker run_job writes (a finished run is skipped on its word)."""
    try:
        d = read_json(done, what="done.json")
    except DataError:
        return False
    return (isinstance(d, dict) and isinstance(d.get("stop_reason"), str) and isinstance(d.get("step"), int)
            and not isinstance(d.get("step"), bool))


def _evaluated(eval_dir: Path) -> dict | None:
    """The summary of a complete evaluation in `eval_dir`, or None when there is none or when its
    files are damaged (results unreadable or not as long as the summary says): then the
    set is evaluated again."""
    from rlmlab.measuring.result_files import has_results, read_results

    if not ((eval_dir / "summary.json").exists() and has_results(eval_dir)):
        return None
    try:
        summary = read_json(eval_dir / "summary.json", what="summary.json")
        complete = isinstance(summary, dict) and summary.get("n") == len(read_results(eval_dir, traces=False))
    except (ValueError, RecursionError, DataError):
        complete = False
    if not complete:
        print(f"{eval_dir}: damaged evaluation files; evaluating again", file=sys.stderr)
        return None
    return summary

"""The training loop both learners share; the learner is only in the data it is given.

    task = load_task(cfg.data.task)                      # once per command, passed down
    split = prepare_data(cfg.data, task)                 # rlmlab.learning.data
    result = train(cfg, split.train, split.val, "runs/x", task=task, validate_fn=...)

One optimizer step takes a fixed token budget of packed rows (see `rlmlab.learning.config` for what
"batch" means), runs them through the model in micro-batches of one row length, and
minimises the mean cross-entropy over the step's target tokens (`rlmlab.learning.step`), at
the learning rate of the step's place in the schedule (`rlmlab.learning.optim`). A wall-clock
limit (`train.max_minutes`) only stops a run.

Validation every `eval_every` steps: teacher-forced loss, per-token accuracy (argmax at every
target position) and example accuracy (every target of an example right) on held-out examples
of the same learner, plus whatever `validate_fn(model, vocab, learner) -> dict` returns (greedy
final-answer accuracy: name it "answer_acc" and "auto" selection picks it). The best
checkpoint follows `train.select_metric`; training stops on max steps, a validation
plateau, the wall-clock limit, or Ctrl-C or SIGTERM (a scheduler's preemption, a shutdown).
A wall-clock limit reached before the step budget, Ctrl-C and SIGTERM leave the run unfinished
("time_limit", "interrupted"): they finish the step and save `last` without validating, so a
resumed run (`rlmlab.learning.resume`) goes on exactly as if it had never stopped.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from rlmlab.attention.backends import attention_kind
from rlmlab.attention.encodings import POSITION_LABELS
from rlmlab.attention.positions import context_limit
from rlmlab.errors import ConfigError, DataError, TrainingDiverged
from rlmlab.learning.checkpoint import has_checkpoint, rng_state, save_checkpoint
from rlmlab.learning.config import RUN_CONFIG_FILE, RunConfig
from rlmlab.learning.data import fit_to_block
from rlmlab.learning.examples import ExampleSet
from rlmlab.learning.learner import get_learner
from rlmlab.learning.model import Transformer
from rlmlab.learning.optim import configure_optimizer, describe_schedule, lr_at
from rlmlab.learning.packing import RowStream, pack_rows, padding_fraction
from rlmlab.learning.resume import resume_run, start_run
from rlmlab.learning.step import (
    FiniteGuard,
    flat_length,
    offset_draws,
    resolve_device,
    step_batches,
    train_step,
    validation_metrics,
)
from rlmlab.learning.tensorboard import TB_DIR, TensorBoardLog, require_tensorboard
from rlmlab.machine import machine_facts
from rlmlab.runlog import UNFINISHED, MetricsLog, check_log
from rlmlab.safeio import refuse_symlinks
from rlmlab.task.taskfile import Task
from rlmlab.task.vocab import Vocab

ValidateFn = Callable[[Transformer, Vocab, str], dict[str, float]]


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    stop_reason: str
    select_metric: str | None
    best_score: float | None
    best_step: int | None
    val: dict  # the last validation's metrics


STOP_SIGNALS = {signal.SIGINT: "interrupt", signal.SIGTERM: "terminated"}

# Stop reasons of a run that is not over: resuming it continues the very same run.


@contextmanager
def _stop_on_signals(echo):
    """First Ctrl-C or SIGTERM: finish the step, save and stop. A second one: abort at once."""
    flag = {"stop": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        if flag["stop"]:
            raise KeyboardInterrupt
        flag["stop"] = True
        echo(f"\n{STOP_SIGNALS[signum]}: stopping after this step and saving (Ctrl-C again to abort)")

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield flag
    finally:
        for sig, was in previous.items():
            signal.signal(sig, was)


def _better(score: float, best: float | None, metric: str, margin: float = 0.0) -> bool:
    if best is None:
        return True
    return score < best - margin if metric.endswith("loss") else score > best + margin


def train(cfg: RunConfig, train_data: ExampleSet, val_data: ExampleSet, run_dir: str | Path, *,
          task: Task, resume: bool = False, validate_fn: ValidateFn | None = None,
          progress: bool = True, echo: Callable[[str], None] = print) -> TrainResult:
    """Train (or with `resume`, continue) a run in `run_dir`; see the module docstring. `task` is
    `cfg.data.task` as the command resolved it."""
    return Trainer(cfg, train_data, val_data, run_dir, task=task, resume=resume, validate_fn=validate_fn,
                   progress=progress, echo=echo).run()


class Trainer:
    """One run: model, optimizer, data stream and bookkeeping. `run()` trains until a stop rule fires."""

    def __init__(self, cfg: RunConfig, train_data: ExampleSet, val_data: ExampleSet, run_dir: str | Path, *,
                 task: Task, resume: bool, validate_fn: ValidateFn | None, progress: bool,
                 echo: Callable[[str], None]):
        self.cfg, self.tc, self.run_dir = cfg, cfg.train, Path(run_dir)
        self.validate_fn, self.progress, self.echo = validate_fn, progress, echo
        tc = self.tc
        cfg.require_stop_rule()
        # Nothing is written through a link: config.json, metrics.jsonl or a checkpoint that
        # leads out of the run folder would be overwritten wherever it points.
        refuse_symlinks(self.run_dir, "run folder", ConfigError)
        check_log(self.run_dir, resume)
        if tc.tensorboard:
            require_tensorboard()  # before anything is written
        self.vocab, self.learner = train_data.vocab, get_learner(train_data.learner)
        if (val_data.vocab, val_data.learner) != (self.vocab, self.learner.name):
            raise DataError("training and validation examples differ in learner or vocabulary")
        self.task = task
        if self.vocab != self.task.vocab:
            raise DataError(f"the examples' vocabulary is not that of {self.task.describe()} (data.task)")
        if self.learner.name != cfg.data.learner:
            raise ConfigError(f"data.learner={cfg.data.learner} but the examples are of learner {self.learner.name}")
        self.device = device = resolve_device(tc.device)
        if tc.threads:
            torch.set_num_threads(tc.threads)
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        model_cfg = cfg.model.build(self.learner.name, len(self.vocab))
        dropped = {}
        limit = context_limit(model_cfg)
        self.train_data, dropped["train"] = fit_to_block(train_data, limit, cfg.data.drop_too_long, "training")
        self.val_data, dropped["val"] = fit_to_block(val_data, limit, cfg.data.drop_too_long, "validation")
        if resume:
            resumed = resume_run(self.run_dir, cfg, self.task, self.train_data, self.val_data, device)
            self.state, self.model, self.last_val = resumed.state, resumed.model, resumed.last_val
        else:
            self.state, self.model = start_run(self.run_dir, tc, model_cfg, device, dropped, self.train_data,
                                               self.val_data)
            self.last_val = {}  # the latest validation, carried into `last` checkpoints
        self.optimizer = configure_optimizer(self.model, tc)
        self.moments_restarted = resumed.restore(self.optimizer) if resume else False
        # only now: a resume refused for its checkpoint leaves the run folder as it was
        (self.run_dir / RUN_CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")
        self.fwd = torch.compile(self.model) if tc.compile else self.model
        self.attention = attention_kind(device, model_cfg)

        spans = self.train_data.lengths - 1  # (N,) positions each training example occupies
        self.stream = RowStream(spans, cfg.data.row_length, tc.seed)
        self.stream.load_state(self.state.stream)
        self.step_tokens = max(1, round(tc.batch_size * float(spans.mean())))
        longest = max(cfg.data.row_length, int(spans.max()), int(self.val_data.lengths.max()) - 1)
        self.flat_len = flat_length(tc, longest, self.step_tokens)  # the "flex" path's one shape
        self.flat_step = -(-(self.step_tokens + longest) // 128) * 128  # ... if a step were one pass
        val_rows = pack_rows(self.val_data.lengths - 1, cfg.data.row_length)
        self.val_batches = step_batches(self.val_data, val_rows, self.vocab.pad_id, tc, device, self.attention,
                                        context_limit(model_cfg), self.flat_len)
        self.rows_per_epoch = len(self.stream.epoch_rows(0))
        self._describe(model_cfg, spans, resume)

        resume_step = self.state.step if resume else None
        mirror = TensorBoardLog(self.run_dir / TB_DIR, resume_step) if tc.tensorboard else None
        self.log = MetricsLog(self.run_dir / "metrics.jsonl", resume_step=resume_step, mirror=mirror)
        self.budget_s = tc.max_minutes * 60 if tc.max_minutes else None
        self.session_start = time.perf_counter()
        self.elapsed_before = self.state.elapsed_s
        self.cpu_start, self.cpu_before = time.process_time(), self.state.cpu_s
        self.step_times: list[float] = []  # this session's training steps, seconds each
        self.interrupted = False
        # A resumed run may continue on another processor, where the same steps round differently.
        if resume:  # so that a run's record says it was interrupted (or extended) and continued
            self.log.write({"kind": "resume", "step": self.state.step, "elapsed_s": round(self.state.elapsed_s, 3),
                            "cpu_s": round(self.state.cpu_s, 3), "machine": machine_facts()}
                           | ({"optimizer": "restarted"} if self.moments_restarted else {}))
        else:
            self.log.write({"kind": "start", "step": 0, "machine": machine_facts()})

    def _describe(self, model_cfg, spans: np.ndarray, resume: bool) -> None:
        cfg, tc, st = self.cfg, self.tc, self.state
        tr, va = self.train_data, self.val_data
        self.echo(f"model: {cfg.model.preset} ({self.learner.name}) {model_cfg.n_layer} layers, {model_cfg.n_head} heads, "
                  f"width {model_cfg.n_embd}, "
                  + (f"{model_cfg.block_size} positions: " if context_limit(model_cfg) is not None else
                     f"{POSITION_LABELS[model_cfg.positions]} positions (no table, no context limit): ")
                  + f"{self.model.num_params(include_positions=False) / 1e6:.2f}M parameters (paper-style: distinct "
                  f"weights, tied embedding once, positional table excluded; "
                  f"{self.model.num_params() / 1e6:.2f}M with it)")
        padding = padding_fraction(self.stream.epoch_rows(0), spans)
        dropped = (f"; dropped {st.dropped['train']} training / {st.dropped['val']} validation examples longer "
                   f"than {model_cfg.block_size}" if st.dropped.get("train") or st.dropped.get("val") else "")
        self.echo(f"data: learner {self.learner.name}, {len(tr):,} training examples from {tr.n_expressions:,} expressions "
                  f"({tr.n_tokens:,} tokens, {tr.n_targets:,} targets), {len(va):,} validation examples; rows of "
                  f"{cfg.data.row_length}+ positions, padding {padding:.1%}; {self.step_tokens:,} positions per step "
                  f"(batch {tc.batch_size} x {spans.mean():.1f}){dropped}"
                  + (f"; each training example starts at a random position 0..{tc.start_offset}"
                     if tc.start_offset else ""))
        self.echo(f"schedule: {describe_schedule(tc, st.schedule_steps)}")
        self.echo(f"device: {self.device}" + (" (bf16 autocast)" if self.device.type == "cuda" else " (fp32)")
                  + (f", FlexAttention over rows of {self.flat_len:,} positions" if self.attention == "flex" else "")
                  + (f" (a step may take several: --train.micro_batch_tokens={self.flat_step} makes it one)"
                     if self.attention == "flex" and self.flat_len < self.flat_step else "")
                  + (", compiled" if tc.compile else "") + f"; run folder {self.run_dir}"
                  + (f"; resuming at step {st.step}" if resume else "")
                  + (" from weights alone (carried without optimizer state): AdamW's moments restart from zero"
                     if self.moments_restarted else ""))

    # --- clock and stopping ---

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.session_start

    def cpu(self) -> float:
        return self.cpu_before + time.process_time() - self.cpu_start

    def should_stop(self) -> str | None:
        """Why the run stops now, or None. "max_minutes" ends a run that has no step budget;
        with one, the wall-clock limit is "time_limit": the run is unfinished, like "interrupted"."""
        tc, st = self.tc, self.state
        if tc.max_steps is not None and st.step >= tc.max_steps:
            return "max_steps"
        if tc.patience is not None and st.bad_evals >= tc.patience:
            return "plateau"
        if self.budget_s is not None and self.elapsed() >= self.budget_s:
            return "time_limit" if tc.max_steps is not None else "max_minutes"
        return "interrupted" if self.interrupted else None

    # --- checkpoints and validation ---

    def save(self, which: str, metrics: dict) -> None:
        self.check_finite()
        last = which == "last"
        if last:
            self.state.elapsed_s, self.state.cpu_s = self.elapsed(), self.cpu()
            self._read_losses()
            self.state.log_window = {"loss": self.window["loss"], "steps": self.window["steps"]}
        save_checkpoint(self.run_dir, which, self.model, vocab=self.vocab, learner=self.learner.name,
                        config=self.cfg.to_dict(),
                        task=self.task,
                        step=self.state.step, metrics=_with_prefix(metrics, "val/") | {"tokens": self.state.tokens},
                        optimizer=self.optimizer if last else None,
                        trainer=asdict(self.state) | {"rng": rng_state(self.device)} if last else None)

    def check_finite(self) -> None:
        """Raise if a step since the last check was not finite (see `FiniteGuard`); the state
        then says the last good step, the one the weights still hold."""
        try:
            self.guard.check()
        except TrainingDiverged as e:
            self.state.step = self.guard.last_good
            kept = has_checkpoint(self.run_dir, "last")
            raise TrainingDiverged(f"{e}; " + ("the last good checkpoint is kept: lower train.lr or resume from it"
                                              if kept else "no checkpoint was saved before it: lower train.lr and "
                                              "train again")) from None

    def _read_losses(self) -> None:
        """Fold the losses of the steps since the last read into the log window (one wait)."""
        w = self.window
        if w["pending"]:
            for loss in torch.stack(w["pending"]).tolist():  # in step order, as floats, as ever
                w["loss"] += loss
            w["pending"] = []

    def validate(self) -> dict:
        self.check_finite()
        t0 = time.perf_counter()
        tc, st, model = self.tc, self.state, self.model
        model.eval()
        metrics = validation_metrics(self.fwd, self.val_batches, len(self.val_data), self.device)
        if self.validate_fn is not None:
            # The hook may sample or use its own RNG; the training stream must not notice.
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                extra = self.validate_fn(model, self.vocab, self.learner.driver)
            metrics.update({k: float(v) for k, v in extra.items()})
        model.train()
        if st.select_metric is None:
            st.select_metric = tc.select_metric if tc.select_metric != "auto" else \
                ("answer_acc" if "answer_acc" in metrics else "loss")
        name = st.select_metric
        if name not in metrics:
            raise ConfigError(f"train.select_metric={name!r} is not a validation metric (have: {', '.join(metrics)})")
        improved = _better(metrics[name], st.best_score, name)
        st.bad_evals = 0 if _better(metrics[name], st.best_score, name, tc.min_delta) else st.bad_evals + 1
        st.last_eval_step = st.step
        if improved:
            st.best_score, st.best_step = metrics[name], st.step
            self.save("best", metrics)
        seconds = time.perf_counter() - t0
        self.log.write({"kind": "val", "step": st.step, **metrics, "best": improved, "val_s": round(seconds, 3),
                        "elapsed_s": round(self.elapsed(), 3), "cpu_s": round(self.cpu(), 3)})
        self.last_val = metrics
        return metrics

    # --- the loop ---

    def run(self) -> TrainResult:
        tc, st = self.tc, self.state
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=tc.max_steps, initial=st.step, unit="step", desc=f"train {self.learner.name}",
                       dynamic_ncols=True)
        # Losses carry over a resume; tok/s is this session's own and counts training steps only,
        # so that a validation or a checkpoint save inside the window does not read as a slowdown.
        # Losses of steps not yet read stay on the device ("pending") until a log point or a save.
        window = self.window = {"loss": st.log_window["loss"], "steps": st.log_window["steps"], "pending": [],
                                "tokens": 0, "step_s": 0.0}
        self.guard = FiniteGuard(self.device, st.step)
        self.model.train()
        try:
            with _stop_on_signals(self.echo) as interrupt:
                stop_reason = self.should_stop()  # a resumed run may have nothing left to do
                while stop_reason is None:
                    t0 = time.perf_counter()
                    lr = lr_at(st.step, tc, st.schedule_steps)
                    for g in self.optimizer.param_groups:
                        g["lr"] = lr
                    loss, n_tok, grad_norm = train_step(self.fwd, self.model, self.optimizer, self.train_data,
                                                        self.stream.take(self.step_tokens), self.vocab.pad_id, tc,
                                                        self.device, self.attention, self.guard, self.flat_len,
                                                        offset_draws(tc, st.step))
                    st.step, st.tokens, st.stream = st.step + 1, st.tokens + n_tok, self.stream.state()
                    self.step_times.append(time.perf_counter() - t0)
                    window["step_s"] += self.step_times[-1]
                    window["pending"].append(loss)
                    window["steps"] += 1
                    window["tokens"] += n_tok
                    if st.step % tc.log_every == 0:
                        self._log_train(window, lr, grad_norm, bar)
                    if bar is not None:
                        bar.update(1)
                    if st.step % tc.eval_every == 0:
                        self.validate()
                    self.interrupted = interrupt["stop"]
                    stop_reason = self.should_stop()
                    if stop_reason is None and st.step % tc.checkpoint_every == 0:
                        self.save("last", self.last_val)
                # A validation off the eval_every grid would make an interrupted run select its
                # best checkpoint differently from an uninterrupted one.
                if st.last_eval_step != st.step and stop_reason not in UNFINISHED:
                    self.validate()
                self.save("last", self.last_val)
            self.log.write({"kind": "end", "step": st.step, "reason": stop_reason, "select_metric": st.select_metric,
                            "best_score": st.best_score, "best_step": st.best_step, "tokens": st.tokens,
                            "elapsed_s": round(st.elapsed_s, 3), "cpu_s": round(st.cpu_s, 3)})
        except TrainingDiverged as e:
            self.log.write({"kind": "diverged", "step": st.step, "error": str(e)})  # the last good step
            raise
        finally:
            if bar is not None:
                bar.close()
            self.log.close()
        return TrainResult(self.run_dir, st.step, stop_reason, st.select_metric, st.best_score, st.best_step,
                           self.last_val)

    def _log_train(self, window: dict, lr: float, grad_norm: torch.Tensor, bar) -> None:
        self.check_finite()
        self._read_losses()
        grad_norm = float(grad_norm)
        st = self.state
        tok_s = window["tokens"] / max(window["step_s"], 1e-9)
        loss = window["loss"] / window["steps"]
        epoch = st.stream["epoch"] + st.stream["cursor"] / max(1, self.rows_per_epoch)
        self.log.write({"kind": "train", "step": st.step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                        "tokens": st.tokens, "tok_s": round(tok_s, 1), "epoch": round(epoch, 4),
                        "elapsed_s": round(self.elapsed(), 3), "cpu_s": round(self.cpu(), 3)})
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tok_s:,.0f}", lr=f"{lr:.2e}", refresh=False)
        window.update(loss=0.0, steps=0, pending=[], tokens=0, step_s=0.0)


def _with_prefix(d: dict, prefix: str) -> dict:
    return {prefix + k: v for k, v in d.items()}


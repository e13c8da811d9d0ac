"""The training loop both learners share; the learner is only in the data it is given.

    split = prepare_data(cfg.data)                       # pool -> train/val examples of one learner
    result = train(cfg, split.train, split.val, "runs/x", validate_fn=...)

One optimizer step takes a fixed token budget of packed rows (see `rlmlab.learning.config` for what
"batch" means), runs them through the model in micro-batches of one row length, and
minimises the mean cross-entropy over the step's target tokens. AdamW decays 2-D weights
only; the learning rate warms up linearly then follows a cosine to lr x min_lr_ratio over a
step horizon (`train.decay_steps`, else `train.max_steps`) fixed when the run starts: the
schedule is a function of the step alone, so a run trains the same steps at the same rates on
any machine, thread count or load. A wall-clock limit (`train.max_minutes`) only stops a run.

Validation every `eval_every` steps: teacher-forced loss, per-token accuracy (argmax at every
target position) and example accuracy (every target of an example right) on held-out examples
of the same learner, plus whatever `validate_fn(model, vocab, learner) -> dict` returns (greedy
final-answer accuracy: name it "answer_acc" and "auto" selection picks it). The best
checkpoint follows `train.select_metric`; training stops on max steps, a validation
plateau, the wall-clock limit, or Ctrl-C or SIGTERM (a scheduler's preemption, a shutdown).
A wall-clock limit reached before the step budget, Ctrl-C and SIGTERM leave the run unfinished
("time_limit", "interrupted"): they finish the step and save `last` without validating, so a
resumed run goes on exactly as if it had never stopped.

Everything that decides the next step (weights, AdamW moments, RNG, data cursor) is in the
`last` checkpoint, so on CPU a resumed run computes the very losses, validations and best
checkpoint of an uninterrupted one.

A training step never waits for the device (docs/gpu.md): batches and their attention masks
are built on the host and moved once, loss and gradient norm stay on the device and are read
at log points, and a non-finite step is skipped on the device (AdamW's `found_inf`) and
reported at the next read, before anything is validated or saved. So on CUDA the host builds
the next step's batches while the device still computes this one. On CUDA the micro-batches
are rows of one fixed length attended with FlexAttention (`attention_kind`), which keeps a
compiled model to one graph.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from rlmlab.machine import machine_facts
from rlmlab.errors import CheckpointError, ConfigError, DataError, TrainingDiverged
from rlmlab.learning.checkpoint import (
    META_FILE,
    build_model,
    checkpoint_dir,
    load_optimizer_state,
    read_meta,
    rng_state,
    run_task,
    save_checkpoint,
    set_rng_state,
)
from rlmlab.learning.config import (
    MAX_SEED,
    RESUMABLE,
    DataSettings,
    RunConfig,
    TrainConfig,
    changed_keys,
)
from rlmlab.learning.learner import learner
from rlmlab.learning.encodings import POSITION_LABELS
from rlmlab.learning.model import Transformer
from rlmlab.learning.positions import context_limit
from rlmlab.learning.packing import (
    IGNORE,
    PackedBatch,
    Row,
    RowStream,
    collate,
    flat_micro_batches,
    micro_batches,
    pack_rows,
    padding_fraction,
)
from rlmlab.learning.tensorboard import TB_DIR, TensorBoardLog, require_tensorboard
from rlmlab.runlog import METRICS, read_metrics
from rlmlab.learning.examples import ExampleSet, build_examples
from rlmlab.task.pool import read_pool
from rlmlab.task.taskfile import load_task
from rlmlab.task.vocab import Vocab

ValidateFn = Callable[[Transformer, Vocab, str], dict[str, float]]
OFFSET_STREAM = 2  # third seed word of the start-offset draws (the data order uses [seed, epoch])


# --- data -------------------------------------------------------------------

@dataclass
class DataSplit:
    """A learner's training and validation examples, and the validation expressions themselves
    (for greedy final-answer validation)."""

    train: ExampleSet
    val: ExampleSet
    val_exprs: list[str]


def read_expr_column(path: str | Path, task=None) -> list[str]:
    """The `expr` column of a pool or expression-set parquet of `task` (default: the paper's)."""
    return read_pool(path, task=task).column("expr").to_pylist()


def prepare_data(data: DataSettings, vocab: Vocab | None = None) -> DataSplit:
    """Read the expressions, split off validation unless a file gives it, and build the
    configured learner's training and validation examples (cached, see `build_examples`)."""
    if data.train is None:
        raise ConfigError("data.train: no training data given (--data pool.parquet)")
    task = load_task(data.task)
    vocab = vocab or task.vocab
    exprs = read_expr_column(data.train, task)
    rows = [f"{data.train}: row {i}" for i in range(len(exprs))]  # for errors: rows of the user's files
    if data.val is not None:
        val_exprs, train_exprs = read_expr_column(data.val, task), exprs
        val_rows, train_rows = [f"{data.val}: row {i}" for i in range(len(val_exprs))], rows
    else:
        if len(exprs) <= data.val_size:
            raise DataError(f"{data.train}: {len(exprs)} expressions, too few to split off "
                            f"data.val_size={data.val_size} for validation")
        is_val = np.zeros(len(exprs), dtype=bool)
        is_val[np.random.default_rng(data.val_seed).permutation(len(exprs))[:data.val_size]] = True
        val_exprs = [e for e, v in zip(exprs, is_val) if v]
        train_exprs = [e for e, v in zip(exprs, is_val) if not v]
        val_rows = [r for r, v in zip(rows, is_val) if v]
        train_rows = [r for r, v in zip(rows, is_val) if not v]
    if data.train_size is not None:
        if data.train_size > len(train_exprs):
            raise DataError(f"data.train_size={data.train_size} but only {len(train_exprs)} training expressions")
        train_exprs = train_exprs[:data.train_size]
    workers = data.workers or os.cpu_count() or 1
    cache = data.resolved_cache_dir()
    return DataSplit(build_examples(train_exprs, data.learner, vocab, workers, cache, where=train_rows, task=task),
                     build_examples(val_exprs, data.learner, vocab, workers, cache, where=val_rows, task=task),
                     val_exprs)


def fit_to_block(data: ExampleSet, block_size: int | None, drop: bool, what: str) -> tuple[ExampleSet, int]:
    """Remove examples that read beyond the positional table (an example of n tokens reads n-1);
    `block_size` None (an encoding without a table) keeps every example."""
    if block_size is None:
        return data, 0
    needed = data.positions_needed
    too_long = needed > block_size
    n = int(too_long.sum())
    if n and not drop:
        raise DataError(f"{n} {what} examples are longer than the model's block_size={block_size} "
                        f"(longest {int(needed.max())}); raise model.block_size or set data.drop_too_long")
    if n == len(data):
        raise DataError(f"every {what} example is longer than the model's block_size={block_size}")
    return data.select(~too_long), n


# --- optimisation -----------------------------------------------------------

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but CUDA is not available")
    return torch.device(name)


def configure_optimizer(model: Transformer, tc: TrainConfig) -> torch.optim.AdamW:
    # Weight decay on matrices (and embedding tables) only; biases and LayerNorm gains are not
    # scales the model should be pulled away from.
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel is one pass over all parameters, ~4x faster than the per-tensor loop on CPU too.
    return torch.optim.AdamW(groups, lr=tc.lr, betas=tc.betas, fused=True)


def lr_at(step: int, tc: TrainConfig, horizon: int | None) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then cosine to the
    floor at step `horizon`; constant after warm-up when there is no horizon."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    if horizon is None or horizon <= tc.warmup_steps:
        return tc.lr
    progress = min(1.0, (step - tc.warmup_steps) / (horizon - tc.warmup_steps))
    floor = tc.lr * tc.min_lr_ratio
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (tc.lr - floor)


def describe_schedule(tc: TrainConfig, horizon: int | None) -> str:
    """`lr_at`'s schedule in words, with where the run stops."""
    stop = tc.max_steps
    if stop and stop <= tc.warmup_steps:
        shape = (f"{tc.warmup_steps:,} warm-up steps to lr {tc.lr:g}, cut short: the run stops in warm-up, "
                 f"at lr {lr_at(stop - 1, tc, horizon):g}")
    elif horizon is None:
        shape = (f"{tc.warmup_steps:,} warm-up steps to lr {tc.lr:g}, then constant (no step horizon: set "
                 "train.max_steps or train.decay_steps for a cosine)")
    elif horizon <= tc.warmup_steps:
        shape = (f"{tc.warmup_steps:,} warm-up steps to lr {tc.lr:g}, then constant (the decay horizon, step "
                 f"{horizon:,}, is within warm-up)")
    else:
        shape = (f"{tc.warmup_steps:,} warm-up steps to lr {tc.lr:g}, then cosine to {tc.lr * tc.min_lr_ratio:g} "
                 f"at step {horizon:,}")
    return (shape + (f"; stops at step {stop:,}" if stop else "")
            + (f"; wall-clock limit {tc.max_minutes:g} min" if tc.max_minutes else ""))


def autocast_for(device: torch.device):
    # bf16 on CUDA (no loss scaling needed); CPU bf16 matmuls are far slower than fp32 there.
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def attention_kind(device: torch.device, dropout: float) -> str:
    """How packed batches attend: "flex" on CUDA (one FlexAttention call per layer over rows of
    one fixed length), "blocks" on CPU and wherever attention dropout is on (FlexAttention has
    none). See `PackedBatch.attention`."""
    return "flex" if device.type == "cuda" and dropout == 0 else "blocks"


def flat_length(tc: TrainConfig, longest: int, step_tokens: int | None = None) -> int:
    """Positions of every micro-batch row on the "flex" path, in whole FlexAttention tiles: a
    whole step (`step_tokens`, plus the most its last row can overshoot it: `longest`, the
    longest row's content) when `micro_batch_tokens` allows, so that a step is one forward
    pass; else `micro_batch_tokens`, at least `longest`."""
    whole = step_tokens + longest if step_tokens is not None else None
    n = whole if whole is not None and whole <= tc.micro_batch_tokens else max(tc.micro_batch_tokens, longest)
    return -(-n // 128) * 128


def step_batches(data: ExampleSet, rows: list[Row], pad_id: int, tc: TrainConfig, device: torch.device,
                 attention: str, block_size: int | None, flat_len: int | None = None,
                 shift: np.random.Generator | None = None) -> list[PackedBatch]:
    """`rows` as micro-batches on `device`, masks included, all built on the host. On the
    "flex" path every micro-batch is one row of `flat_len` positions (default:
    `flat_length(tc, block_size)`). `block_size`: the model's context limit (None: none).
    `shift`: draws the examples' start offsets when `tc.start_offset` is on (None: all at 0)."""
    if attention == "flex":
        flat_len = flat_len or flat_length(tc, block_size if block_size is not None else max(r.length for r in rows))
        groups = [[r] for r in flat_micro_batches(rows, data.lengths - 1, flat_len)]
    else:
        groups = micro_batches(rows, tc.micro_batch_tokens)
    return [collate(data.ids, data.loss, data.offsets, mb, pad_id, data.layout, block_size, shift,
                    tc.start_offset).prepare(device, attention)
            for mb in groups]


def offset_draws(tc: TrainConfig, step: int) -> np.random.Generator | None:
    """The generator of step `step`'s start offsets (None when `train.start_offset` is off): a
    function of the seed and the step alone, so that a resumed run draws what it would have."""
    return np.random.default_rng([tc.seed, step, OFFSET_STREAM]) if tc.start_offset else None


def batch_loss(fwd, batch: PackedBatch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy over the batch's targets, logits)."""
    mask = batch.mask if batch.prepared else batch.attention()
    with autocast_for(device):
        logits = fwd(batch.idx, pos=batch.pos, attn_mask=mask)  # (B, T, V)
    logits = logits.float()
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch.targets.view(-1), ignore_index=IGNORE,
                           reduction="sum")
    return loss, logits


@torch.no_grad()
def validation_metrics(fwd, batches: list[PackedBatch], n_examples: int, device: torch.device) -> dict[str, float]:
    """Teacher-forced loss per target token, per-token accuracy and whole-example accuracy
    (`batches` on the host, or prepared on `device`; read back once, at the end)."""
    losses, hits = [], []
    n_targets = 0
    wrong_example = torch.zeros(n_examples + 1, dtype=torch.bool, device=device)  # last slot: padding
    for b in batches:
        b = b if b.prepared else b.to(device)
        loss, logits = batch_loss(fwd, b, device)
        is_target = b.targets != IGNORE
        hit = (logits.argmax(-1) == b.targets) & is_target
        losses.append(loss)
        hits.append(hit.sum())
        n_targets += b.n_targets
        miss_doc = torch.where(is_target & ~hit, b.doc, n_examples)
        wrong_example[miss_doc.view(-1)] = True
    per_batch = torch.stack(losses).tolist()
    correct = int(torch.stack(hits).sum())
    loss_sum = 0.0
    for x in per_batch:  # summed on the host in batch order, as the numbers were before
        loss_sum += x
    return {"loss": loss_sum / n_targets, "token_acc": correct / n_targets,
            "example_acc": 1.0 - int(wrong_example[:n_examples].sum()) / n_examples}


# --- the loop ---------------------------------------------------------------

@dataclass
class TrainerState:
    """What the loop carries between steps beyond weights and optimizer (saved as JSON)."""

    step: int = 0
    elapsed_s: float = 0.0  # wall clock of all sessions, validation included
    cpu_s: float = 0.0  # CPU time of this process over all sessions: a clock other jobs on the machine barely move
    tokens: int = 0  # example positions trained on (padding excluded)
    schedule_steps: int | None = None  # the cosine's horizon, fixed when the run starts
    stream: dict = field(default_factory=lambda: {"epoch": 0, "cursor": 0})
    select_metric: str | None = None
    best_score: float | None = None
    best_step: int | None = None
    bad_evals: int = 0  # validations since the last improvement by more than min_delta
    log_window: dict = field(default_factory=lambda: {"loss": 0.0, "steps": 0})
    """Training losses since the last logged record, so that a record after a resume averages
    the same steps as without the interruption."""
    last_eval_step: int | None = None
    dropped: dict = field(default_factory=dict)
    data_sha256: dict | None = None
    """`ExampleSet.digest` of the training and validation examples the run started on
    ({"train": ..., "val": ...}): a run carried to another machine or folder rebuilds its data,
    and must resume on the very same examples (None: saved before this was recorded)."""

    @classmethod
    def from_saved(cls, saved: dict, ckpt: Path) -> "TrainerState":
        """The state a checkpoint recorded, its types checked (CheckpointError otherwise)."""
        # "horizon" was a schedule length estimated from a time budget (before schedules were
        # in steps); a run that saved it resumes on its config's step horizon.
        try:
            state = cls(**{k: v for k, v in saved.items() if k not in ("rng", "horizon")})
        except TypeError as e:
            raise CheckpointError(f"{ckpt}: malformed trainer state ({e})") from None
        numbers = {"step": int, "tokens": int, "bad_evals": int, "elapsed_s": (int, float), "cpu_s": (int, float)}
        bad = [k for k, t in numbers.items() if not isinstance(getattr(state, k), t)
               or isinstance(getattr(state, k), bool) or not 0 <= getattr(state, k) < math.inf]
        horizon = state.schedule_steps
        if horizon is not None and (not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1):
            bad.append("schedule_steps")
        optional = {"best_step": int, "last_eval_step": int, "best_score": (int, float), "select_metric": str}
        bad += [k for k, t in optional.items() if getattr(state, k) is not None and (
                not isinstance(getattr(state, k), t) or isinstance(getattr(state, k), bool)
                or (t is not str and not -math.inf < getattr(state, k) < math.inf)
                or (t is int and getattr(state, k) < 0))]
        digests = state.data_sha256
        if digests is not None and not (isinstance(digests, dict) and set(digests) == {"train", "val"}
                                        and all(isinstance(v, str) for v in digests.values())):
            bad.append("data_sha256")
        if not (isinstance(state.dropped, dict) and all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for k, v in state.dropped.items())):
            bad.append("dropped")
        window = state.log_window
        if not (isinstance(window, dict) and isinstance(window.get("loss"), (int, float))
                and isinstance(window.get("steps"), int) and not isinstance(window.get("steps"), bool)
                and window["steps"] >= 0 and math.isfinite(window["loss"])):
            bad.append("log_window")
        stream = state.stream
        if not (isinstance(stream, dict) and all(isinstance(stream.get(k), int) and not isinstance(stream[k], bool)
                                                 and 0 <= stream[k] <= MAX_SEED for k in ("epoch", "cursor"))):
            bad.append("stream")
        if bad:
            raise CheckpointError(f"{ckpt}: malformed trainer state ({', '.join(bad)})")
        return state


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
UNFINISHED = ("interrupted", "time_limit")


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


class MetricsLog:
    """metrics.jsonl: one JSON object per line, flushed as written."""

    def __init__(self, path: Path, resume_step: int | None = None, mirror=None):
        """A new log, or with `resume_step` the existing one continued after that step; `mirror`
        (a `rlmlab.learning.tensorboard.TensorBoardLog`) gets every record too."""
        self.path, self.mirror = path, mirror
        if resume_step is not None and not path.exists() and (path.parent / METRICS).exists():
            # a finished run, converted on export, trained on (`--extend`): its log goes on as lines
            path.write_text("".join(json.dumps(r) + "\n" for r in read_metrics(path.parent)))
            (path.parent / METRICS).unlink()
        if resume_step is not None and path.exists():
            # A run killed after its last save logged steps that the resumed run will redo.
            kept = [line for line in path.read_text(errors="replace").splitlines() if _step_of(line) <= resume_step]
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            tmp.replace(path)
        self.f = open(path, "a" if resume_step is not None else "w")

    def write(self, record: dict) -> None:
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()
        if self.mirror is not None:
            self.mirror.write(record)

    def close(self) -> None:
        self.f.close()
        if self.mirror is not None:
            self.mirror.close()


def _step_of(line: str) -> float:
    """The step of a metrics line; a line cut short by a kill (or not a record) counts as after every step."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return math.inf
    return step if isinstance(step, (int, float)) and not isinstance(step, bool) and step == step else math.inf


def _better(score: float, best: float | None, metric: str, margin: float = 0.0) -> bool:
    if best is None:
        return True
    return score < best - margin if metric.endswith("loss") else score > best + margin


def train(cfg: RunConfig, train_data: ExampleSet, val_data: ExampleSet, run_dir: str | Path, *,
          resume: bool = False, validate_fn: ValidateFn | None = None, progress: bool = True,
          echo: Callable[[str], None] = print) -> TrainResult:
    """Train (or with `resume`, continue) a run in `run_dir`; see the module docstring."""
    return Trainer(cfg, train_data, val_data, run_dir, resume=resume, validate_fn=validate_fn, progress=progress,
                   echo=echo).run()


class Trainer:
    """One run: model, optimizer, data stream and bookkeeping. `run()` trains until a stop rule fires."""

    def __init__(self, cfg: RunConfig, train_data: ExampleSet, val_data: ExampleSet, run_dir: str | Path, *,
                 resume: bool, validate_fn: ValidateFn | None, progress: bool, echo: Callable[[str], None]):
        self.cfg, self.tc, self.run_dir = cfg, cfg.train, Path(run_dir)
        self.validate_fn, self.progress, self.echo = validate_fn, progress, echo
        tc = self.tc
        cfg.require_stop_rule()
        if tc.tensorboard:
            require_tensorboard()  # before anything is written
        self.vocab, self.learner = train_data.vocab, train_data.learner
        if (val_data.vocab, val_data.learner) != (self.vocab, self.learner):
            raise DataError("training and validation examples differ in learner or vocabulary")
        self.task = load_task(cfg.data.task)
        if self.vocab != self.task.vocab:
            raise DataError(f"the examples' vocabulary is not that of {self.task.describe()} (data.task)")
        if self.learner != cfg.data.learner:
            raise ConfigError(f"data.learner={cfg.data.learner} but the examples are of learner {self.learner}")
        self.device = device = resolve_device(tc.device)
        if tc.threads:
            torch.set_num_threads(tc.threads)
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        model_cfg = cfg.model.build(self.learner, len(self.vocab))
        self.state = TrainerState()
        dropped = {}
        limit = context_limit(model_cfg)
        self.train_data, dropped["train"] = fit_to_block(train_data, limit, cfg.data.drop_too_long, "training")
        self.val_data, dropped["val"] = fit_to_block(val_data, limit, cfg.data.drop_too_long, "validation")
        self.last_val: dict = {}  # the latest validation, carried into `last` checkpoints
        if resume:
            ckpt = checkpoint_dir(self.run_dir, "last")
            meta = read_meta(ckpt)
            if "trainer" not in meta:
                raise CheckpointError(f"{ckpt}: no trainer state to resume from")
            self.state = TrainerState.from_saved(meta["trainer"], ckpt)
            saved = RunConfig.from_dict(meta["config"])
            # Where the data files lie may change (a run carried to another machine or folder)
            # once the checkpoint says what they held; their contents are compared below.
            moved = {"data.train", "data.val"} if self.state.data_sha256 is not None else set()
            fixed = [k for k in changed_keys(saved, cfg) if k not in RESUMABLE | moved]
            if fixed:
                raise ConfigError(f"--resume cannot change {', '.join(fixed)} (the run was trained with "
                                  f"{', '.join(f'{k}={_get(saved, k)!r}' for k in fixed)})")
            if tc.max_steps is not None and tc.max_steps < self.state.step:
                # its checkpoints would record a step beyond their own budget, which loading refuses
                raise ConfigError(f"--resume: train.max_steps={tc.max_steps} is below the step the run has reached "
                                  f"({self.state.step}); give at least {self.state.step}")
            run_task(meta, ckpt, self.task)  # a run continues on its own task only
            if meta["vocab"] != list(self.vocab.tokens) or meta["learner"] != self.learner:
                raise DataError(f"{ckpt}: trained as another learner or on another vocabulary than the given data")
            if self.state.data_sha256 not in (None, self._data_sha256()):
                other = [k for k, v in self._data_sha256().items() if self.state.data_sha256[k] != v]
                raise DataError(f"{ckpt}: the run was trained on other {' and '.join(other)} examples than the "
                                "given data (their SHA-256 differs); resume it on the data it started with")
            # A run saved before digests were recorded resumed on its own files: record them now,
            # so that from here on it can move too.
            self.state.data_sha256 = self._data_sha256()
            self.model = build_model(meta, ckpt, device)
            if "schedule_steps" not in meta["trainer"]:  # saved before schedules were fixed at the start
                self.state.schedule_steps = tc.decay_steps or tc.max_steps
            self.last_val = {k[4:]: v for k, v in meta["metrics"].items() if k.startswith("val/")}
        else:
            if any((self.run_dir / p).exists() for p in ("last", "best", ".last.old")):
                raise ConfigError(f"{self.run_dir} already holds a run: pass --resume to continue it, "
                                  "or choose another --out")
            self.run_dir.mkdir(parents=True, exist_ok=True)
            torch.manual_seed(tc.seed)
            self.model = Transformer(model_cfg).to(device)
            self.state.dropped = dropped
            self.state.schedule_steps = tc.decay_steps or tc.max_steps
            self.state.data_sha256 = self._data_sha256()
        self.optimizer = configure_optimizer(self.model, tc)
        self.moments_restarted = False
        if resume:
            self.moments_restarted = not load_optimizer_state(ckpt, meta, self.optimizer)
            set_rng_state(meta["trainer"].get("rng"))
        # only now: a resume refused for its checkpoint leaves the run folder as it was
        (self.run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")
        self.fwd = torch.compile(self.model) if tc.compile else self.model
        self.attention = attention_kind(device, model_cfg.dropout)
        if model_cfg.positions == "alibi":  # the flex path has no score_mod for ALiBi's bias
            self.attention = "blocks"

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

    def _data_sha256(self) -> dict[str, str]:
        if not hasattr(self, "_digests"):
            self._digests = {"train": self.train_data.digest(), "val": self.val_data.digest()}
        return self._digests

    def _describe(self, model_cfg, spans: np.ndarray, resume: bool) -> None:
        cfg, tc, st = self.cfg, self.tc, self.state
        tr, va = self.train_data, self.val_data
        self.echo(f"model: {cfg.model.preset} ({self.learner}) {model_cfg.n_layer} layers, {model_cfg.n_head} heads, "
                  f"width {model_cfg.n_embd}, "
                  + (f"{model_cfg.block_size} positions: " if context_limit(model_cfg) is not None else
                     f"{POSITION_LABELS[model_cfg.positions]} positions (no table, no context limit): ")
                  + f"{self.model.num_params(include_positions=False) / 1e6:.2f}M parameters (paper-style: distinct "
                  f"weights, tied embedding once, positional table excluded; "
                  f"{self.model.num_params() / 1e6:.2f}M with it)")
        padding = padding_fraction(self.stream.epoch_rows(0), spans)
        dropped = (f"; dropped {st.dropped['train']} training / {st.dropped['val']} validation examples longer "
                   f"than {model_cfg.block_size}" if st.dropped.get("train") or st.dropped.get("val") else "")
        self.echo(f"data: learner {self.learner}, {len(tr):,} training examples from {tr.n_expressions:,} expressions "
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
        save_checkpoint(self.run_dir, which, self.model, vocab=self.vocab, learner=self.learner, config=self.cfg.to_dict(),
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
            kept = any((self.run_dir / w / META_FILE).exists() for w in ("last", ".last.old"))
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
                extra = self.validate_fn(model, self.vocab, learner(self.learner).driver)
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

            bar = tqdm(total=tc.max_steps, initial=st.step, unit="step", desc=f"train {self.learner}",
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


class FiniteGuard:
    """Which optimizer step first had a non-finite loss or gradient norm, kept on the device.

    From that step on, AdamW skips every update (its `found_inf`, as under a gradient scaler),
    so the weights and moments stay those of the last good step without the host waiting for
    the check; `check` reads the record (one wait) and raises TrainingDiverged. The trainer
    checks at every log point and before anything is validated or saved, so no checkpoint
    holds a step after the bad one."""

    def __init__(self, device: torch.device, step: int = 0):
        self.found = torch.zeros((), device=device)  # 1.0 once a step was bad: AdamW's found_inf
        self.bad = torch.tensor([-1.0, math.nan, math.nan], dtype=torch.float64, device=device)  # step, loss, norm
        self.step = step  # optimizer steps recorded so far

    def record(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """The loss and gradient norm of step `self.step + 1`, before its update."""
        self.step += 1
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        first = bad & (self.found == 0)
        # new_full is a fill on the device: a tensor from a host number would be a (waiting) copy.
        now = torch.stack([loss.new_full((), float(self.step), dtype=torch.float64), loss.double(),
                           grad_norm.double()])
        self.bad = torch.where(first, now, self.bad)
        self.found = torch.maximum(self.found, bad.to(self.found.dtype))

    def check(self) -> int | None:
        """Raise TrainingDiverged if a recorded step was not finite (`last_good` then says the
        step whose weights the model still holds)."""
        step, loss, norm = self.bad.tolist()
        if step < 0:
            return None
        self.last_good = int(step) - 1
        raise TrainingDiverged(f"non-finite training loss or gradient at step {int(step)} (loss {loss}, "
                               f"gradient norm {norm})")


def train_step(fwd, model: Transformer, optimizer, data: ExampleSet, rows: list[Row], pad_id: int,
               tc: TrainConfig, device: torch.device, attention: str = "blocks",
               guard: FiniteGuard | None = None, flat_len: int | None = None,
               shift: np.random.Generator | None = None) -> tuple[torch.Tensor, int, torch.Tensor]:
    """One optimizer step over `rows`: (mean target loss, example positions, gradient norm),
    loss and norm as 0-d tensors on `device`, read by nobody here: the host does not wait.

    A step whose loss or gradient is not finite leaves weights and optimizer untouched; with a
    `guard` it is recorded there for the caller to check later, without one it raises
    TrainingDiverged at once (a wait). `shift`: as in `step_batches`."""
    batches = step_batches(data, rows, pad_id, tc, device, attention, context_limit(model.cfg), flat_len, shift)
    mean, grad_norm = optimizer_step(fwd, model, optimizer, batches, tc, device, guard)
    return mean, sum(b.n_tokens for b in batches), grad_norm


def optimizer_step(fwd, model: Transformer, optimizer, batches: list[PackedBatch], tc: TrainConfig,
                   device: torch.device, guard: FiniteGuard | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The device half of `train_step`: forward and backward over prepared `batches`, clipping
    and the AdamW update. Reads no device value unless `guard` is None."""
    n_targets = sum(b.n_targets for b in batches)
    total = torch.zeros((), device=device)
    for b in batches:
        loss, _ = batch_loss(fwd, b, device)
        (loss / n_targets).backward()  # the step's mean over targets, however the rows are split
        total += loss.detach()
    clip = tc.grad_clip if tc.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)  # a few kernels, not 2 per tensor
    mean = total.double() / n_targets  # as the host would divide: a float64 of the float32 sum
    checked_now = guard is None
    if checked_now:
        guard = FiniteGuard(device)
    guard.record(mean, grad_norm)
    optimizer.found_inf = guard.found  # a bad step is skipped on the device
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if checked_now:
        guard.check()
    return mean, grad_norm


def _with_prefix(d: dict, prefix: str) -> dict:
    return {prefix + k: v for k, v in d.items()}


def _get(cfg: RunConfig, key: str):
    section, name = key.split(".", 1)
    return getattr(getattr(cfg, section), name)

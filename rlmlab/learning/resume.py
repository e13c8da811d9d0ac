"""Where a run starts: a new run's state, or the one its `last` checkpoint saved, checked
against the config, task and data it is resumed with.

Everything that decides the next step (weights, AdamW moments, RNG, data cursor) is in the
`last` checkpoint, so on CPU a resumed run computes the very losses, validations and best
checkpoint of an uninterrupted one. `rlmlab.learning.checkpoint` writes that state; this module
reads the optimizer's and the RNG's part back (`load_optimizer_state`, `set_rng_state`), and
`drop_optimizer` makes a weights-only resume point of it for `rlmlab export --resumable`.
"""

from __future__ import annotations

import base64
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from rlmlab.errors import CheckpointError, ConfigError, DataError
from rlmlab.learning.checkpoint import (
    FORMAT,
    META_FILE,
    OPTIM_FILE,
    OPTIMIZER_KEYS,
    build_model,
    checkpoint_dir,
    meta_digest,
    read_checkpoint_meta,
    run_task,
)
from rlmlab.learning.config import MAX_SEED, RESUMABLE, ModelConfig, RunConfig, TrainConfig, changed_keys
from rlmlab.learning.examples import ExampleSet
from rlmlab.learning.model import Transformer
from rlmlab.safeio import read_json, shorten
from rlmlab.task.taskfile import Task


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


def data_digests(train: ExampleSet, val: ExampleSet) -> dict[str, str]:
    """What `TrainerState.data_sha256` records."""
    return {"train": train.digest(), "val": val.digest()}


def start_run(run_dir: Path, tc: TrainConfig, model_cfg: ModelConfig, device: torch.device, dropped: dict,
              train: ExampleSet, val: ExampleSet) -> tuple[TrainerState, Transformer]:
    """A new run in `run_dir`, which must not hold one: its state and freshly seeded model."""
    if any((run_dir / p).exists() for p in ("last", "best", ".last.old")):
        raise ConfigError(f"{run_dir} already holds a run: pass --resume to continue it, "
                          "or choose another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(tc.seed)
    model = Transformer(model_cfg).to(device)
    state = TrainerState(schedule_steps=tc.decay_steps or tc.max_steps, dropped=dropped,
                         data_sha256=data_digests(train, val))
    return state, model


@dataclass
class Resumed:
    """A run read back from its `last` checkpoint (`resume_run`). The optimizer's moments and
    the RNG wait for `restore`: the optimizer is built from the model first."""

    ckpt: Path
    meta: dict
    state: TrainerState
    model: Transformer
    last_val: dict  # the validation the checkpoint carries

    def restore(self, optimizer: torch.optim.Optimizer) -> bool:
        """Load AdamW's moments and the RNG; True when the checkpoint carried no optimizer
        state, so that the moments restart from zero."""
        restarted = not load_optimizer_state(self.ckpt, self.meta, optimizer)
        set_rng_state(self.meta["trainer"].get("rng"))
        return restarted


def resume_run(run_dir: Path, cfg: RunConfig, task: Task, train: ExampleSet, val: ExampleSet,
               device: torch.device) -> Resumed:
    """The run in `run_dir`, continued with `cfg` on `task` and the examples `train` and `val`
    (CheckpointError, ConfigError or DataError where they differ from what it was trained with)."""
    tc = cfg.train
    ckpt = checkpoint_dir(run_dir, "last")
    meta = read_checkpoint_meta(ckpt)
    if "trainer" not in meta:
        raise CheckpointError(f"{ckpt}: no trainer state to resume from")
    state = TrainerState.from_saved(meta["trainer"], ckpt)
    saved = RunConfig.from_dict(meta["config"])
    # Where the data files lie may change (a run carried to another machine or folder)
    # once the checkpoint says what they held; their contents are compared below.
    moved = {"data.train", "data.val"} if state.data_sha256 is not None else set()
    fixed = [k for k in changed_keys(saved, cfg) if k not in RESUMABLE | moved]
    if fixed:
        raise ConfigError(f"--resume cannot change {', '.join(fixed)} (the run was trained with "
                          f"{', '.join(f'{k}={_get(saved, k)!r}' for k in fixed)})")
    if tc.max_steps is not None and tc.max_steps < state.step:
        # its checkpoints would record a step beyond their own budget, which loading refuses
        raise ConfigError(f"--resume: train.max_steps={tc.max_steps} is below the step the run has reached "
                          f"({state.step}); give at least {state.step}")
    run_task(meta, ckpt, task)  # a run continues on its own task only
    if meta["vocab"] != list(train.vocab.tokens) or meta["learner"] != train.learner:
        raise DataError(f"{ckpt}: trained as another learner or on another vocabulary than the given data")
    digests = data_digests(train, val)
    if state.data_sha256 not in (None, digests):
        other = [k for k, v in digests.items() if state.data_sha256[k] != v]
        raise DataError(f"{ckpt}: the run was trained on other {' and '.join(other)} examples than the "
                        "given data (their SHA-256 differs); resume it on the data it started with")
    # A run saved before digests were recorded resumed on its own files: record them now,
    # so that from here on it can move too.
    state.data_sha256 = digests
    model = build_model(meta, ckpt, device)
    if "schedule_steps" not in meta["trainer"]:  # saved before schedules were fixed at the start
        state.schedule_steps = tc.decay_steps or tc.max_steps
    last_val = {k[4:]: v for k, v in meta["metrics"].items() if k.startswith("val/")}
    return Resumed(ckpt, meta, state, model, last_val)


def _get(cfg: RunConfig, key: str):
    section, name = key.split(".", 1)
    return getattr(getattr(cfg, section), name)


def load_optimizer_state(ckpt: Path, meta: dict, optimizer: torch.optim.Optimizer) -> bool:
    """Restore `optimizer` from the checkpoint; False (the optimizer left fresh) when it was
    carried without its optimizer state (`drop_optimizer`)."""
    if meta.get("optimizer_dropped") is True and "optimizer" not in meta and OPTIM_FILE not in meta["files"]:
        return False
    if "optimizer" not in meta or OPTIM_FILE not in meta["files"]:
        raise CheckpointError(f"{ckpt}: no optimizer state (only 'last' checkpoints can be resumed)")
    try:
        tensors = load_file(str(ckpt / OPTIM_FILE))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{ckpt}: cannot load {OPTIM_FILE} ({e})") from None
    # Optimizer.load_state_dict moves each moment to its parameter's device (and leaves step
    # counts where AdamW keeps them), so CPU tensors serve any device.
    restore_optimizer(optimizer, tensors, meta["optimizer"])
    return True


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Load AdamW's moments and step counts; each moment must have its parameter's shape and
    dtype and be finite (the fused AdamW would otherwise turn every weight into NaN)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for name, t in tensors.items():
        try:
            state, idx, key = name.split(".", 2)
            idx = int(idx)
        except ValueError:
            raise CheckpointError(f"optimizer state is malformed (tensor {shorten(repr(name))})") from None
        if state != "state" or key not in OPTIMIZER_KEYS or not 0 <= idx < len(params):
            raise CheckpointError(f"optimizer state holds a tensor this model's AdamW has not ({shorten(name)})")
        p = params[idx]
        # AdamW keeps its step count as a float32 scalar (fused or not) and its moments like the parameter.
        shape, dtype = (torch.Size([]), torch.float32) if key == "step" else (p.shape, p.dtype)
        if t.shape != shape or t.dtype != dtype:
            raise CheckpointError(f"optimizer state does not fit this model ({name}: {tuple(t.shape)} {t.dtype}, "
                                  f"expected {tuple(shape)} {dtype})")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"optimizer state holds non-finite values ({name})")
    try:
        state: dict[int, dict] = {}
        for name, t in tensors.items():
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = t
        for name, v in meta["scalars"].items():
            idx, key = name.split(".", 1)
            state.setdefault(int(idx), {})[key] = v
        groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"optimizer state is malformed or does not fit this model ({e})") from None


def set_rng_state(state: dict) -> None:
    def tensor(s: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(s, validate=True)), dtype=torch.uint8)

    try:
        torch.set_rng_state(tensor(state["torch"]))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([tensor(s) for s in state["cuda"]])
    except (ValueError, KeyError, TypeError, RuntimeError) as e:  # binascii.Error is a ValueError
        raise CheckpointError(f"saved random-number state is malformed ({type(e).__name__})") from None


def drop_optimizer(ckpt: Path) -> None:
    """Make the `last` checkpoint `ckpt` a weights-only resume point, as `rlmlab export
    --resumable` carries it: optimizer.safetensors is removed and checkpoint.json resealed
    without the optimizer state, saying `"optimizer_dropped": true`. A run resumed from it
    restarts AdamW's moments from zero (its log says so), so it is a continuation of the same
    recipe, not the uninterrupted run; the weights, data cursor and random state carry on."""
    raw = read_json(ckpt / META_FILE, CheckpointError, META_FILE)
    # The seal is checked before it is renewed, so that an edited checkpoint.json is not laundered;
    # the optimizer file itself may already be gone (an export does not copy it).
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("digest") != meta_digest(raw):
        raise CheckpointError(f"{ckpt}: not an intact {FORMAT} checkpoint")
    if not isinstance(raw.get("trainer"), dict) or not isinstance(raw.get("files"), dict):
        raise CheckpointError(f"{ckpt}: not a resume point (no trainer state)")
    raw.pop("optimizer", None)
    raw["files"].pop(OPTIM_FILE, None)
    raw["optimizer_dropped"] = True
    raw["digest"] = meta_digest(raw)
    tmp = ckpt / f".{META_FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(raw, indent=1))
    os.replace(tmp, ckpt / META_FILE)
    (ckpt / OPTIM_FILE).unlink(missing_ok=True)
    read_checkpoint_meta(ckpt)  # the weights against their SHA-256, the rest as any checkpoint

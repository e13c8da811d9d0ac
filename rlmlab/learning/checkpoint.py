"""Checkpoints: safetensors for tensors, JSON for everything else; atomic; never unpickled.

A run folder holds

    config.json        the run's configuration (for people; each checkpoint carries its own copy)
    metrics.jsonl      one JSON record per training log, validation and end of run
    last/              the latest state: resumes the run exactly
    best/              the weights that scored best on the selection metric (no optimizer)

and a checkpoint folder holds

    model.safetensors      weights (the tied output embedding stored once)
    optimizer.safetensors  AdamW moments and step counts (last/ only)
    checkpoint.json        format, step, learner, model config, run config, vocabulary, metrics,
                           optimizer hyper-parameters, trainer state (RNG, data cursor, clock)
                           the SHA-256 of each tensor file, and `digest`: the SHA-256 of
                           all of the above (`meta_digest`), so that an edit to the
                           vocabulary, the learner or the model config is refused on load

A checkpoint is written into a temporary folder next to its final place, synced, then
renamed into place; the previous one is moved aside first and deleted last. A save killed at
any point leaves either the old or the new checkpoint complete (`load` falls back to the
moved-aside one if the kill came between the two renames).

The digest detects accidents, not forgery: anyone can edit checkpoint.json and seal it again.
So what the metadata says is also checked against what the rest of the checkpoint says
(`check_metadata`): the learner and model config against the run config they were saved with
and the run folder's config.json, the step against the run's budget, every tensor's dtype and
shape against the model config, and the format against the one its tensor files were written
in (a newer checkpoint relabelled as the format without a digest is refused).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_file, save_model

from rlmlab.errors import CheckpointError, RlmlabError
from rlmlab.learning.config import RUN_CONFIG_FILE, RunConfig, apply_dict
from rlmlab.learning.learner import get_learner
from rlmlab.learning.model import ModelConfig, Transformer
from rlmlab.safeio import read_json, regular_file, shorten
from rlmlab.task.taskfile import Task, check_same_task, load_task, paper_task
from rlmlab.task.vocab import Vocab

FORMAT = "rlmlab-checkpoint/3"
# Earlier formats, which load as before (released checkpoints, runs in progress resume across
# the upgrade): /2 names the learner "view" (under its digest, so it is read, never rewritten);
# /1 also predates the metadata digest: its tensor files are still checked, its metadata cannot be.
VIEW_FORMAT = "rlmlab-checkpoint/2"
LEGACY_FORMAT = "rlmlab-checkpoint/1"
READABLE = (FORMAT, VIEW_FORMAT, LEGACY_FORMAT)
# Every format names itself in its tensor files' header too ({"format": ...}), which is how a
# checkpoint.json relabelled as /1 (to escape the digest) is told from one /1 wrote. The sealed
# formats are not held to their header: /2 and /3 are sealed alike, so a /3 file under a /2
# label loses no check.
MODEL_FILE, OPTIM_FILE, META_FILE = "model.safetensors", "optimizer.safetensors", "checkpoint.json"
# What checkpoint.json must hold, and the JSON type of each entry (formats /1 and /2 hold the
# learner as "view": `read_checkpoint_meta` hands it on as "learner").
META_TYPES = {"step": int, "learner": str, "model_config": dict, "config": dict, "vocab": list, "metrics": dict,
              "files": dict, "optimizer": dict, "trainer": dict}
JSON_NAMES = {int: "an integer", str: "a string", list: "a list", dict: "an object"}
WHICH = ("best", "last")
MAX_STEP = 2**63 - 1  # a step of a run with no step budget: what the trainer state's counters allow
# What each parameter is stored as: the model is trained and saved in float32 (CUDA runs
# autocast their matmuls, their weights stay float32); a loader would cast any other dtype
# silently.
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}
OPTIMIZER_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step")


@dataclass
class LoadedRun:
    """A trained model ready for inference, with what it was trained on."""

    model: Transformer  # eval mode
    vocab: Vocab
    learner: str  # the learner it was trained as, without encoding: "cot", "rm", ...
    config: dict  # the run configuration: {"model": ..., "data": ..., "train": ...}
    step: int
    metrics: dict  # validation (and training) metrics at that step
    task: Task | None = None  # the task it was trained on (its vocabulary is the task's)

    @property
    def named(self) -> str:
        """The learner as experiments name it, which summaries record: `learner`, with
        "@<encoding>" unless the model has the paper's learned table ("cot@rope"), so that a
        summary written by `rlmlab eval`, `probe` or `frames` is labelled like one of `rlmlab run`."""
        encoding = self.model.cfg.positions
        return self.learner if encoding == "learned" else f"{self.learner}@{encoding}"


# --- writing ----------------------------------------------------------------

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def meta_digest(meta: dict) -> str:
    """SHA-256 of checkpoint.json's content other than `digest` itself, as canonical JSON (sorted
    keys, no spaces): it does not depend on how the file is indented, and covers the SHA-256 of
    each tensor file, so one digest seals the whole checkpoint."""
    body = {k: v for k, v in meta.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer's state dict into tensors (for safetensors) and JSON."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"state.{idx}.{key}"] = v.detach().contiguous().cpu()
            else:
                scalars[f"{idx}.{key}"] = v
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def rng_state(device: torch.device) -> dict:
    state = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if device.type == "cuda":
        state["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return state


def save_checkpoint(run_dir: str | Path, which: str, model: Transformer, *, vocab: Vocab, learner: str,
                    config: dict, step: int, metrics: dict, optimizer: torch.optim.Optimizer | None = None,
                    trainer: dict | None = None, task: Task | None = None) -> Path:
    """Write `run_dir/<which>/` atomically; returns its path. `task` is recorded (name, digest
    and how to load it) so that the checkpoint is refused on any other task."""
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob(f".{which}.tmp-*"):  # left by a save that was killed
        shutil.rmtree(stale, ignore_errors=True)
    tmp = run_dir / f".{which}.tmp-{os.getpid()}"
    tmp.mkdir()
    meta = {"format": FORMAT, "step": step, "learner": learner, "model_config": model.cfg.to_dict(), "config": config,
            "vocab": list(vocab.tokens), "metrics": metrics, "files": {}}
    save_model(model, str(tmp / MODEL_FILE), metadata={"format": FORMAT})
    files = [MODEL_FILE]
    if optimizer is not None:
        tensors, meta["optimizer"] = optimizer_tensors(optimizer)
        save_file(tensors, str(tmp / OPTIM_FILE), metadata={"format": FORMAT})
        files.append(OPTIM_FILE)
    if trainer is not None:
        meta["trainer"] = trainer
    if task is not None:
        meta["task"] = {**task.identity, "spec": task.spec}
    for name in files:
        meta["files"][name] = _sha256(tmp / name)
        _fsync(tmp / name)
    meta["digest"] = meta_digest(meta)
    (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
    _fsync(tmp / META_FILE)
    _fsync(tmp)

    final, aside = run_dir / which, run_dir / f".{which}.old"
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
    os.rename(tmp, final)
    _fsync(run_dir)
    shutil.rmtree(aside, ignore_errors=True)
    return final


# --- reading ----------------------------------------------------------------

def _found(run_dir: Path, which: str) -> Path | None:
    """The folder of `run_dir`'s `which` checkpoint, or the one a save killed between its two
    renames left set aside; None without either."""
    return next((c for c in (run_dir / which, run_dir / f".{which}.old") if (c / META_FILE).exists()), None)


def has_checkpoint(run_dir: str | Path, which: str) -> bool:
    """Whether `checkpoint_dir` finds a `which` checkpoint in `run_dir`."""
    return _found(Path(run_dir), which) is not None


def checkpoint_dir(run_dir: str | Path, which: str) -> Path:
    """The folder of a run's `which` checkpoint, checked to exist."""
    run_dir = Path(run_dir)
    if which not in WHICH:
        raise CheckpointError(f"which must be one of {', '.join(WHICH)}, got {which!r}")
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such run folder")
    if (found := _found(run_dir, which)) is not None:
        return found
    have = [w for w in WHICH if (run_dir / w).is_dir()]
    raise CheckpointError(f"{run_dir}: no '{which}' checkpoint" + (f" (has: {', '.join(have)})" if have else ""))


def read_checkpoint_meta(ckpt: Path) -> dict:
    """checkpoint.json, checked against its digest, with the tensor files it names (the weights
    at least) checked against their SHA-256. The learner is under "learner" whatever the format
    (formats before /3 name it "view" on disk)."""
    try:
        meta = read_json(ckpt / META_FILE, CheckpointError, META_FILE)
    except CheckpointError as e:
        raise CheckpointError(f"{ckpt}: {META_FILE} is missing or not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") not in READABLE:
        raise CheckpointError(f"{ckpt}: not an {FORMAT} checkpoint")
    sealed = meta["format"] != LEGACY_FORMAT
    sealed_as = meta_digest(meta)  # of the file as written, before the old name is read as the new one
    if meta["format"] != FORMAT:
        if "learner" in meta:
            raise CheckpointError(f"{ckpt}: {META_FILE}: 'learner' in a {meta['format']} checkpoint (it says 'view')")
        if "view" in meta:
            meta["learner"] = meta.pop("view")
    for key, kind in META_TYPES.items():
        if key not in meta:
            if key in ("optimizer", "trainer"):  # only in 'last' checkpoints
                continue
            raise CheckpointError(f"{ckpt}: {META_FILE} lacks '{key}'")
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            raise CheckpointError(f"{ckpt}: {META_FILE}: '{key}' should be {JSON_NAMES[kind]}, "
                                  f"not {type(meta[key]).__name__}")
    if not all(isinstance(t, str) for t in meta["vocab"]):
        raise CheckpointError(f"{ckpt}: {META_FILE}: 'vocab' should list token strings")
    for name, digest in meta["files"].items():
        if name not in (MODEL_FILE, OPTIM_FILE) or not isinstance(digest, str):
            raise CheckpointError(f"{ckpt}: {META_FILE} names an unexpected file {shorten(repr(name))}")
    if MODEL_FILE not in meta["files"]:  # an empty 'files' would switch the weight check off
        raise CheckpointError(f"{ckpt}: {META_FILE}: 'files' lacks the SHA-256 of {MODEL_FILE}")
    if sealed and meta.get("digest") != sealed_as:
        raise CheckpointError(f"{ckpt}: {META_FILE} was edited after it was saved (its digest does not match)")
    if not sealed and "digest" in meta:
        raise CheckpointError(f"{ckpt}: {META_FILE}: 'format' says {LEGACY_FORMAT}, which wrote no 'digest': "
                              "a newer checkpoint relabelled as the format without a metadata digest is refused")
    for name, digest in meta["files"].items():
        path = ckpt / name
        if not path.exists():
            raise CheckpointError(f"{ckpt}: {name} is missing")
        regular_file(path, CheckpointError, name)  # a FIFO would block the checksum, a folder end it in an OSError
        if _sha256(path) != digest:
            raise CheckpointError(f"{ckpt}: {name} is corrupt (checksum mismatch)")
        if not sealed and (written := _written_as(path)) != LEGACY_FORMAT:
            raise CheckpointError(f"{ckpt}: {META_FILE}: 'format' says {LEGACY_FORMAT}, but its {name} was written "
                                  f"as {shorten(str(written))}: a newer checkpoint relabelled as the format without "
                                  "a metadata digest is refused")
    check_metadata(meta, ckpt)
    return meta


def _written_as(path: Path) -> str | None:
    """The format a tensor file's header names (save_checkpoint writes it there too)."""
    try:
        with safe_open(str(path), "pt") as f:
            header = f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: cannot read its header ({str(e).splitlines()[0]})") from None
    return header.get("format")


def check_metadata(meta: dict, ckpt: Path) -> None:
    """What checkpoint.json says, checked against what else the checkpoint says: the digest
    cannot tell a forged checkpoint.json from a saved one, and a /1 checkpoint has none. The
    step must lie within the run's step budget (and be its trainer state's); the learner must be
    the one its run config and the run folder's config.json name; the model config must be the
    one those make for that learner and vocabulary, so that a model config edited to other
    heads, or a learner swapped over weights of another (RM's 512 positions under CoT's 4,096),
    is refused rather than decoded wrongly. Run configs without a `model` or `data` section
    (checkpoints saved by hand) are checked for what they do say."""
    step, config = meta["step"], meta["config"]
    train = config.get("train")
    budget = train.get("max_steps") if isinstance(train, dict) else None
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        budget = None
    if not 0 <= step <= (budget or MAX_STEP):
        raise CheckpointError(f"{ckpt}: {META_FILE}: 'step' is {shorten(str(step))}, not a step of its run (0 to "
                              + (f"train.max_steps={budget:,})" if budget else f"{MAX_STEP:,})"))
    trainer = meta.get("trainer")
    if isinstance(trainer, dict) and "step" in trainer and trainer["step"] != step:
        raise CheckpointError(f"{ckpt}: {META_FILE}: 'step' is {step:,}, its trainer state's step "
                              f"{shorten(repr(trainer['step']))}")
    name = meta["learner"]
    try:
        encoding = get_learner(name).encoding
    except RlmlabError as e:
        raise CheckpointError(f"{ckpt}: {META_FILE}: 'learner': {shorten(str(e))}") from None
    if encoding is not None:
        raise CheckpointError(f"{ckpt}: {META_FILE}: 'learner' {shorten(repr(name))} names an encoding "
                              "(a checkpoint records it in model_config.positions)")
    try:
        cfg = ModelConfig(**meta["model_config"]).to_dict()
    except (TypeError, RlmlabError) as e:
        raise CheckpointError(f"{ckpt}: bad model config ({shorten(str(e))})") from None
    _check_run_config(config, name, len(meta["vocab"]), cfg, ckpt)
    path = ckpt.parent / RUN_CONFIG_FILE
    if path.exists():
        run_config = read_json(path, CheckpointError, RUN_CONFIG_FILE)
        if not isinstance(run_config, dict):
            raise CheckpointError(f"{path}: not a run configuration (an object with sections model, data, train)")
        _check_run_config(run_config, name, len(meta["vocab"]), cfg, ckpt, path)


def _check_run_config(config: dict, name: str, vocab_size: int, model_config: dict, ckpt: Path,
                      path: Path | None = None) -> None:
    """`config` (a run configuration, whole or in part: the checkpoint's own, or with `path` the
    run folder's config.json) names learner `name` and makes `model_config` for it."""
    where = f"{ckpt}: {META_FILE}: its run config" if path is None else f"{path}"
    data = config.get("data")
    said = data.get("learner", data.get("view")) if isinstance(data, dict) else None
    if said is not None and said != name:
        raise CheckpointError(f"{ckpt}: {META_FILE}: 'learner' is {name!r}, but its run config has data.learner="
                              f"{shorten(repr(said))}" if path is None else
                              f"{path}: data.learner is {shorten(repr(said))}, but {ckpt} was saved as learner {name!r}")
    section = config.get("model")
    if section is None:
        return
    try:
        settings = apply_dict(RunConfig(), {"model": section}, where=where).model
        # With a preset, every size follows from it and the learner; without one (a partial
        # config written by hand), only the sizes it names.
        made = (settings.build(name, vocab_size).to_dict() if "preset" in section
                else {k: v for k, v in section.items() if k in model_config and v is not None})
    except RlmlabError as e:
        raise CheckpointError(f"{where}: its model settings make no model for learner {name!r} "
                              f"({shorten(str(e))})") from None
    for key, value in made.items():
        if model_config.get(key) != value:
            makes = (f"(model.preset={section['preset']}, learner {name!r}) makes model.{key}={value!r}"
                     if "preset" in section else f"has model.{key}={value!r}")
            raise CheckpointError(f"{ckpt}: {META_FILE}: 'model_config' has {key}={model_config.get(key)!r}, but its "
                                  f"run config {makes}" if path is None else
                                  f"{path}: {makes}, but {ckpt} holds a model with {key}={model_config.get(key)!r}")


def build_model(meta: dict, ckpt: Path, device: str | torch.device = "cpu",
                encoding: str | None = None) -> Transformer:
    """The checkpoint's model; with `encoding`, refused unless it was trained with that position
    encoding.
    A checkpoint written before encodings were an option has the paper's learned table."""
    try:
        cfg = ModelConfig(**meta["model_config"])
    except (TypeError, RlmlabError) as e:
        raise CheckpointError(f"{ckpt}: bad model config ({e})") from None
    run_model = meta["config"].get("model")
    said = run_model.get("positions", "learned") if isinstance(run_model, dict) else cfg.positions
    if said != cfg.positions:
        raise CheckpointError(f"{ckpt}: its model config has positions={cfg.positions!r}, its run config "
                              f"model.positions={said!r}")
    if encoding is not None and encoding != cfg.positions:
        raise CheckpointError(f"{ckpt}: trained with model.positions={cfg.positions}, not {encoding}")
    _check_shapes(cfg, ckpt)
    model = Transformer(cfg)
    try:
        load_model(model, str(ckpt / MODEL_FILE), strict=True)
    except (SafetensorError, RuntimeError, OSError) as e:
        raise CheckpointError(f"{ckpt}: cannot load {MODEL_FILE} ({str(e).splitlines()[0]})") from None
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise CheckpointError(f"{ckpt}: {MODEL_FILE} holds non-finite weights ({', '.join(bad[:3])})")
    return model.to(device)


def _check_shapes(cfg: ModelConfig, ckpt: Path) -> None:
    """The weights file holds the tensors `cfg` builds, of their shapes and dtype, read from its
    header before anything is allocated: a damaged config (a block size of 10^8) must not
    allocate gigabytes, and weights of another dtype (int32) would be cast silently on load."""
    try:
        with safe_open(str(ckpt / MODEL_FILE), "pt") as f:
            saved = {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{ckpt}: cannot read {MODEL_FILE} ({str(e).splitlines()[0]})") from None
    if cfg.n_layer > len(saved):  # every layer holds tensors; this bounds the meta model below
        raise CheckpointError(f"{ckpt}: model config has {cfg.n_layer} layers, {MODEL_FILE} {len(saved)} tensors")
    with torch.device("meta"):
        expected = {name: (tuple(t.shape), SAFETENSORS_DTYPES.get(t.dtype, str(t.dtype)))
                    for name, t in Transformer(cfg).state_dict().items()}
    if ("wpe.weight" in saved) != ("wpe.weight" in expected):
        raise CheckpointError(f"{ckpt}: {MODEL_FILE} {'holds' if 'wpe.weight' in saved else 'lacks'} a positional "
                              f"table, which its model config's positions={cfg.positions!r} "
                              f"{'does not have' if 'wpe.weight' in saved else 'needs'}")
    for name, (shape, dtype) in saved.items():
        if name not in expected:
            raise CheckpointError(f"{ckpt}: {MODEL_FILE} holds a tensor its model config does not make "
                                  f"({shorten(name)})")
        if expected[name][0] != shape:
            raise CheckpointError(f"{ckpt}: {MODEL_FILE} does not match its model config "
                                  f"({name} is {list(shape)}, the config makes {list(expected[name][0])})")
        if expected[name][1] != dtype:
            raise CheckpointError(f"{ckpt}: {MODEL_FILE}: {name} is stored as {dtype}, the model's weights are "
                                  f"{expected[name][1]}")


def run_task(meta: dict, ckpt: Path, task: Task | str | None = None) -> Task:
    """The task of a checkpoint: `task` when given (refused if the checkpoint records another),
    else the one it records, else (checkpoints from before tasks were recorded) the paper's."""
    recorded = meta.get("task")
    if task is not None:
        task = load_task(task)
        check_same_task(recorded, task, f"{ckpt}")
        return task
    if recorded is None:
        return paper_task()
    if not isinstance(recorded, dict) or not isinstance(recorded.get("spec"), str):
        raise CheckpointError(f"{ckpt}: {META_FILE}: malformed 'task' record")
    try:
        task = load_task(recorded["spec"])
    except RlmlabError as e:
        raise CheckpointError(f"{ckpt}: cannot load the task it was trained on ({e}); pass --task") from None
    check_same_task(recorded, task, f"{ckpt}")
    return task


def load_run(run_dir: str | Path, which: str = "best", device: str | torch.device = "cpu",
             encoding: str | None = None, task: Task | str | None = None) -> LoadedRun:
    """Load a run's `best` or `last` model in eval mode (CheckpointError on any problem, and
    when `encoding` is given and the run was trained with another position encoding). The
    checkpoint's vocabulary must be its task's (`run_task`): a model whose token ids mean other
    tokens would decode, and score, nonsense."""
    ckpt = checkpoint_dir(run_dir, which)
    meta = read_checkpoint_meta(ckpt)
    try:
        vocab = Vocab(meta["vocab"])
    except RlmlabError as e:
        raise CheckpointError(f"{ckpt}: bad vocabulary ({e})") from None
    task = run_task(meta, ckpt, task)
    if vocab != task.vocab:
        raise CheckpointError(f"{ckpt}: its vocabulary differs from that of {task.describe()} "
                              "(tokens reordered, added or missing)")
    model = build_model(meta, ckpt, device, encoding).eval()
    if model.cfg.vocab_size != len(vocab):
        raise CheckpointError(f"{ckpt}: model has {model.cfg.vocab_size} token ids, vocabulary {len(vocab)}")
    return LoadedRun(model, vocab, meta["learner"], meta["config"], int(meta["step"]), meta["metrics"], task)

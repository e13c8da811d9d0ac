"""Run configuration: three dataclass sections (model, data, train), validated on construction.

Every field has a docstring (shown by `rlmlab train --help`). A run's settings come from, in
order: the defaults below, a config file (JSON or TOML, with sections `model`, `data`,
`train`), `--section.key=value` overrides, then the dedicated flags (`--learner`, `--max-steps`, ...).
Unknown keys and values of the wrong type raise a one-line `ConfigError` naming the key. Keys
renamed since (`OLD_KEYS`: `data.view` is now `data.learner`) are still read under their old
name, so that saved `config.json` files and old command lines keep working.

What "batch" means with packing: `train.batch_size` is the paper's 64 examples, turned into
a token budget per optimizer step of batch_size x (mean positions per training example),
filled with whole packed rows. A step therefore holds about batch_size examples (exactly that
many tokens' worth) and every step costs the same compute, which keeps shapes static and
steps comparable between the learners; the loss is the mean over the step's target tokens.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
import types
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from rlmlab.attention.encodings import check_encoding
from rlmlab.attention.position_index import check_index
from rlmlab.errors import ConfigError, RlmlabError
from rlmlab.safeio import check_fits, parse_json, read_bytes

# --- model ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 64
    """Vocabulary size (set from the data's vocabulary, not by hand)."""
    n_layer: int = 6
    """Transformer blocks."""
    n_head: int = 6
    """Attention heads per block; must divide n_embd."""
    n_embd: int = 384
    """Residual stream width."""
    block_size: int = 2048
    """Positional-embedding table size of `positions="learned"`, which is also the longest
    sequence (or frame) such a model reads; the other encodings have no table and no limit."""
    dropout: float = 0.0
    """Dropout on attention and residual branches (the paper uses none)."""
    positions: str = "learned"
    """Position encoding (rlmlab.attention.positions): "learned" (the paper's absolute table),
    "none" (NoPE), "rope" or "alibi"."""
    position_index: str | None = None
    """Where each token's position counts from (rlmlab.attention.position_index): None, the
    learner's own (CoT the trace's start, RM its frame's); "trace" or "frame" for the other."""

    def __post_init__(self):
        check_encoding(self.positions)
        check_index(self.position_index)
        if self.position_index is not None and self.positions == "alibi":
            # The cached decoding step biases a cached key by its cache column, which is its position
            # only at the learner's own index.
            raise ConfigError("model.position_index cannot be combined with model.positions=alibi")
        for f in fields(self):
            if f.name in ("positions", "position_index"):
                continue
            v = getattr(self, f.name)
            want = float if f.name == "dropout" else int
            if not isinstance(v, want) or isinstance(v, bool):
                if not (want is float and isinstance(v, int) and not isinstance(v, bool)):
                    raise ConfigError(f"model.{f.name} must be {want.__name__}, got {v!r}")
        if min(self.vocab_size, self.n_layer, self.n_head, self.n_embd, self.block_size) < 1:
            raise ConfigError("model sizes must be positive")
        if self.n_embd % self.n_head:
            raise ConfigError(f"model.n_head={self.n_head} must divide model.n_embd={self.n_embd}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        check_fits(4 * self.n_params(), f"a model of {self.n_layer} layers of width {self.n_embd} and "
                   f"{self.block_size} positions (fp32 weights)", ConfigError)

    def n_params(self) -> int:
        """Parameters this config makes (tied embedding once, positional table included)."""
        return (self.vocab_size + self.block_size) * self.n_embd + body_params(self.n_layer, self.n_embd)

    def to_dict(self) -> dict:
        return asdict(self)


def body_params(n_layer: int, n_embd: int) -> int:
    """Parameters outside the token embedding and the positional table: the blocks and the final
    norm. The paper counts its model this way (6 layers of width 384: 10.65M)."""
    d = n_embd
    return n_layer * (12 * d * d + 13 * d) + 2 * d


# Context sizes: RM reads one frame (short), CoT the whole flattened trace (long).
MODEL_PRESETS: dict[str, dict[str, dict]] = {
    # The paper's backbone: 6 layers, 6 heads, width 384; 2,048 positions for RM, 4,096 for CoT.
    "paper": {"rm": dict(n_layer=6, n_head=6, n_embd=384, block_size=2048),
              "cot": dict(n_layer=6, n_head=6, n_embd=384, block_size=4096)},
    # CPU-sized: 3 layers of width 128 learn as much per token as 4 layers of width 256, several
    # times faster (measurements: docs/cpu-sizing.md). The positional tables must cover the
    # longest frame / trace of the splits the small experiments evaluate.
    "small": {"rm": dict(n_layer=3, n_head=4, n_embd=128, block_size=512),
              "cot": dict(n_layer=3, n_head=4, n_embd=128, block_size=4096)},
    # The small model with 8 heads of width 16: CoT learns its copies faster per CPU minute
    # (docs/recipe.md); the paper-cpu preset trains both learners with it.
    "cpu": {"rm": dict(n_layer=3, n_head=8, n_embd=128, block_size=512),
            "cot": dict(n_layer=3, n_head=8, n_embd=128, block_size=4096)},
    # Between `cpu` (0.6M weights without the table) and `paper` (10.65M): 4 layers of width 256,
    # 3.2M, a little above their geometric mean (2.5M); 8 heads of width 32 (`cpu`: 8 of 16).
    "mid": {"rm": dict(n_layer=4, n_head=8, n_embd=256, block_size=512),
            "cot": dict(n_layer=4, n_head=8, n_embd=256, block_size=4096)},
    # For tests: runs in milliseconds.
    "tiny": {"rm": dict(n_layer=2, n_head=2, n_embd=32, block_size=256),
             "cot": dict(n_layer=2, n_head=2, n_embd=32, block_size=2048)},
}


def preset(name: str, learner: str, vocab_size: int, **overrides) -> ModelConfig:
    """The preset's sizes for a learner: the "rm" column for learners with short contexts (active
    frames, windows, widened to hold a window), the "cot" column for whole traces and reductions."""
    if name not in MODEL_PRESETS:
        raise ConfigError(f"unknown model preset {name!r} (have: {', '.join(MODEL_PRESETS)})")
    from rlmlab.learning.observe import observer

    obs = observer(learner)
    base = dict(MODEL_PRESETS[name][obs.family])
    if obs.context_bound is not None:
        # A window of K tokens must fit the positional table whatever the preset.
        base["block_size"] = max(base["block_size"], obs.context_bound)
    if overrides.get("position_index") == "trace":
        # Tokens placed where they stand in the trace need the whole-trace table.
        base["block_size"] = max(base["block_size"], MODEL_PRESETS[name]["cot"]["block_size"])
    return ModelConfig(vocab_size=vocab_size, **{**base, **overrides})


@dataclass(frozen=True)
class ModelSettings:
    preset: str = "small"
    """Architecture preset: paper (6L/6H/384), small (3L/4H/128, CPU-sized), cpu (3L/8H/128, the paper-cpu
    recipe) or tiny (tests)."""
    n_layer: int | None = None
    """Override the preset's number of Transformer blocks."""
    n_head: int | None = None
    """Override the preset's attention heads."""
    n_embd: int | None = None
    """Override the preset's residual width."""
    block_size: int | None = None
    """Override the preset's positional table (longest example a learned-position model reads)."""
    dropout: float | None = None
    """Override the preset's dropout (the paper uses none)."""
    positions: str = "learned"
    """Position encoding: "learned" (the paper's table, whose size block_size is also the context
    limit), "none" (NoPE), "rope" or "alibi" (no table, no context limit); docs/positions.md."""
    position_index: str | None = None
    """Where positions count from: null (the learner's own: CoT from the trace's start, RM from
    its active frame's), "frame" (a CoT token at its place in RM's active frame) or "trace" (an RM
    token at its place in the flattened trace); docs/positions.md, "Where positions count from"."""

    def __post_init__(self):
        _typecheck(self, "model")
        check_encoding(self.positions)
        check_index(self.position_index)
        if self.preset not in MODEL_PRESETS:
            raise ConfigError(f"model.preset: unknown preset {self.preset!r} (have: {', '.join(MODEL_PRESETS)})")

    def build(self, learner: str, vocab_size: int) -> ModelConfig:
        overrides = {f.name: getattr(self, f.name) for f in fields(self)
                     if f.name != "preset" and getattr(self, f.name) is not None}
        return preset(self.preset, learner, vocab_size, **overrides)


@dataclass(frozen=True)
class DataSettings:
    learner: str = "rm"
    """The learner, i.e. what the model reads: "rm" (active frames, lane-packed), "rm-frames"
    (active frames one by one: same objective, more tokens), "cot" (whole flattened trace),
    "window:K" (the last K tokens) or "reduce" (completed calls collapsed to their values);
    docs/observation.md. Old name: `data.view`."""
    train: str | None = None
    """Training expressions: a pool parquet (`rlmlab data pool`) or any parquet with an `expr` column."""
    val: str | None = None
    """Validation expressions (parquet); when absent, `val_size` expressions are split off `train`."""
    val_size: int = 1000
    """Expressions split off for validation when no `val` file is given (paper: 1,000)."""
    val_seed: int = 0
    """Seed of that split; independent of train.seed so that every seed sees the same split."""
    train_size: int | None = None
    """Use only the first N training expressions (after the split): nested subsets for sample-size sweeps."""
    row_len: int | None = None
    """Base packed-row length; a longer example gets a row of its own. Default: 128 for the RM
    learners (an active-frame example averages ~30 tokens, a frame's lanes ~35; a dense mask costs
    attention over the whole row, so short rows train ~1.5x faster than 512 on CPU), 512 for cot."""
    drop_too_long: bool = True
    """Drop examples longer than the model's positional table (counted and reported); if false, fail."""
    cache_dir: str | None = None
    """Where encoded examples are cached as .npz (default: ~/.cache/rlmlab/examples; "" disables)."""
    workers: int | None = None
    """Processes that execute expressions when building examples (default: every core)."""
    task: str = "paper"
    """The task the expressions belong to: a built-in name (paper, mod7) or a task file (docs/tasks.md)."""

    def __post_init__(self):
        _typecheck(self, "data")
        from rlmlab.learning.learner import get_learner

        try:
            encoding = get_learner(self.learner).encoding
        except ConfigError as e:
            raise ConfigError(f"data.learner: {e}") from None
        if encoding is not None:
            raise ConfigError(f"data.learner: {self.learner!r} names a learner with a position encoding; set "
                              f"data.learner={self.learner.partition('@')[0]} and model.positions={encoding}")
        _positive(self, "data", "val_size", "row_len", "train_size", "workers")
        _seed(self.val_seed, "data.val_seed")

    @property
    def row_length(self) -> int:
        from rlmlab.learning.learner import get_learner

        return self.row_len or get_learner(self.learner).row_length

    def resolved_cache_dir(self) -> Path | None:
        if self.cache_dir == "":
            return None
        return Path(self.cache_dir) if self.cache_dir else Path.home() / ".cache" / "rlmlab" / "examples"


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 1e-3
    """Peak learning rate (paper: 1e-3)."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas (paper: 0.9, 0.99)."""
    weight_decay: float = 0.1
    """AdamW weight decay, applied to 2-D weights only (paper: 0.1; the IID sweep uses 0)."""
    batch_size: int = 64
    """Examples per optimizer step, as a token budget: batch_size x mean positions per training
    example, filled with whole packed rows (paper: 64)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    warmup_steps: int = 2000
    """Linear warm-up steps from 0 to `lr` (paper: 2,000)."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr x min_lr_ratio."""
    decay_steps: int | None = None
    """Step at which the cosine reaches its floor. Default: max_steps. Fixed when the run starts;
    with neither, the learning rate stays at `lr` after warm-up (no schedule is ever derived
    from elapsed time)."""
    max_steps: int | None = None
    """Step budget: the run ends after this many optimizer steps."""
    max_minutes: float | None = None
    """Wall-clock limit (validation included; summed across resumes). It only stops a run and
    never changes its schedule; with a step budget the run is left unfinished and resumable.
    Machine-dependent: two machines stop at different steps."""
    patience: int | None = None
    """Stop when the selection metric has not improved for this many validations (None: never)."""
    min_delta: float = 0.0
    """Improvement smaller than this does not reset the patience counter."""
    select_metric: str = "auto"
    """Validation metric that picks the best checkpoint: "auto" = answer_acc when a final-answer
    validator is plugged in, else loss; or any reported name (loss, token_acc, example_acc, ...)."""
    eval_every: int = 500
    """Validate every this many steps (and at the end)."""
    answer_eval: int = 0
    """`rlmlab train` only: greedy-decode the first N validation expressions at each validation
    and report answer_acc, the final-answer accuracy (uses rlmlab.decoding.driver; 0: off)."""
    save_every: int | None = None
    """Write the `last` checkpoint every this many steps (default: eval_every) and at the end."""
    log_every: int = 10
    """Write a training record to metrics.jsonl every this many steps."""
    micro_batch_tokens: int = 16384
    """Most positions one forward/backward pass processes; a larger step accumulates gradients."""
    seed: int = 1337
    """Seed of the initial weights, the data order and dropout."""
    start_offset: int = 0
    """Largest random start position of a training example (0: off; every example starts at
    position 0, as in the paper). With N > 0 each training example's positions are shifted by
    an offset drawn uniformly from 0..min(N, the table rows left after the example), so that
    rows of a learned positional table beyond the longest training example are trained
    (randomized positions, Ruoss et al. 2023); set it to the model's block_size to use the whole
    table. Validation and evaluation start at 0. Drawn from (seed, step): resumes are exact."""
    device: str = "auto"
    """"auto" (cuda when present, else cpu), "cpu", "cuda" or "cuda:N"."""
    compile: bool = False
    """torch.compile the model (worth it on CUDA; on CPU it gains ~0-5% for a ~1 min compile)."""
    threads: int | None = None
    """CPU threads for torch (default: torch's choice)."""
    tensorboard: bool = False
    """Also write metrics.jsonl's records as TensorBoard scalars to the run folder's tb/ (needs
    the tensorboard extra: pip install "rlmlab[tensorboard]")."""

    def __post_init__(self):
        _typecheck(self, "train")
        if not self.lr > 0:
            raise ConfigError(f"train.lr must be > 0, got {self.lr}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"train.betas must lie in [0, 1), got {self.betas}")
        for name in ("weight_decay", "grad_clip", "min_delta"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _positive(self, "train", "batch_size", "decay_steps", "max_steps", "max_minutes", "patience",
                  "eval_every", "save_every", "log_every", "micro_batch_tokens", "threads", "warmup_steps",
                  "answer_eval", "start_offset", allow_zero=("warmup_steps", "answer_eval", "start_offset"))
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"train.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        _seed(self.seed, "train.seed")
        if self.threads is not None and self.threads > MAX_THREADS:
            raise ConfigError(f"train.threads must be at most {MAX_THREADS}, got {self.threads}")

    @property
    def checkpoint_every(self) -> int:
        return self.save_every or self.eval_every


@dataclass(frozen=True)
class RunConfig:
    model: ModelSettings = field(default_factory=ModelSettings)
    data: DataSettings = field(default_factory=DataSettings)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return apply_dict(cls(), d)

    def __post_init__(self):
        # Rows are int64 ids, targets, loss weights and positions: four arrays of the batch's size.
        check_fits(32 * self.train.batch_size * self.data.row_length,
                   f"a batch of train.batch_size={self.train.batch_size} rows of {self.data.row_length}+ "
                   "positions", ConfigError)

    def require_stop_rule(self) -> None:
        t = self.train
        if t.max_steps is None and t.max_minutes is None and t.patience is None:
            raise ConfigError("no stopping rule: set train.max_steps (--max-steps), train.max_minutes "
                              "(--minutes) or train.patience")


SECTIONS = {"model": ModelSettings, "data": DataSettings, "train": TrainConfig}
# Keys renamed since, by section: {old name: new name}. Config files, `--section.key` overrides,
# typed settings and every saved config.json may still use the old name; naming both is refused.
OLD_KEYS: dict[str, dict[str, str]] = {"data": {"view": "learner"}}

# Fields a resumed run may change: when and how it stops, logs and runs, never what it learns.
RESUMABLE = frozenset({"train.max_steps", "train.max_minutes", "train.patience", "train.min_delta",
                       "train.eval_every", "train.save_every", "train.log_every", "train.device",
                       "train.compile", "train.threads", "train.micro_batch_tokens", "data.cache_dir",
                       "data.workers"})


def field_docs(cls) -> dict[str, str]:
    """The docstring under each field, read from the source (for --help)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            docs[a.target.id] = " ".join(str(b.value.value).split())
    return docs


# --- typing and parsing -----------------------------------------------------

def _hints(cls) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _allowed(tp) -> tuple[object, bool]:
    """(base type, whether None is allowed) of an annotation like `int | None`."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _type_name(tp) -> str:
    base, optional = _allowed(tp)
    name = "pair of floats" if typing.get_origin(base) is tuple else base.__name__
    return name + (" or null" if optional else "")


def _conforms(value, tp) -> bool:
    base, optional = _allowed(tp)
    if value is None:
        return optional
    if typing.get_origin(base) is tuple:
        args = typing.get_args(base)
        return isinstance(value, tuple) and len(value) == len(args) and \
            all(_conforms(v, a) for v, a in zip(value, args))
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, base)


def _typecheck(obj, section: str) -> None:
    hints = _hints(type(obj))
    for f in fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, list):  # from JSON/TOML
            v = tuple(v)
            object.__setattr__(obj, f.name, v)
        if _allowed(hints[f.name])[0] is float and isinstance(v, int) and not isinstance(v, bool):
            object.__setattr__(obj, f.name, float(v))
        if isinstance(v, tuple):
            object.__setattr__(obj, f.name, tuple(float(x) if isinstance(x, int) and not isinstance(x, bool)
                                                  else x for x in v))
        if not _conforms(getattr(obj, f.name), hints[f.name]):
            raise ConfigError(f"{section}.{f.name}: expected {_type_name(hints[f.name])}, got {v!r}")


# A fixed bound rather than this machine's core count: a run's config.json, resumed or carried
# to a smaller machine, must still load there. No machine has this many hardware threads, and
# torch.set_num_threads(10**9) would try to start them all.
MAX_THREADS = 1024
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a signed 64-bit seed; NumPy's generators any non-negative one


def _seed(value: int, key: str) -> None:
    if not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{key} must be a seed in [0, 2**63 - 1], got {value}")


def _positive(obj, section: str, *names: str, allow_zero: tuple[str, ...] = ()) -> None:
    for name in names:
        v = getattr(obj, name)
        if v is not None and (v < 0 or (v == 0 and name not in allow_zero)):
            raise ConfigError(f"{section}.{name} must be {'>= 0' if name in allow_zero else '> 0'}, got {v}")


def parse_value(text: str, tp, key: str):
    """A command-line string as a value of annotation `tp` (JSON syntax accepted)."""
    base, optional = _allowed(tp)
    low = text.strip().lower()
    if optional and low in ("none", "null"):
        return None
    if base is str:
        return text
    if base is bool:
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
    else:
        try:
            value = json.loads(text)
        except RecursionError:
            raise ConfigError(f"{key}: value nested too deeply") from None
        except ValueError:
            value = [x for x in text.split(",")] if typing.get_origin(base) is tuple else text
        if typing.get_origin(base) is tuple and isinstance(value, list):
            try:
                value = tuple(json.loads(x) if isinstance(x, str) else x for x in value)
            except (ValueError, RecursionError):
                pass
        if _conforms(value, tp):
            return value
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {text!r}")


def apply_dict(cfg: RunConfig, d: dict, where: str = "config") -> RunConfig:
    """Overlay a nested {section: {key: value}} mapping; unknown keys raise."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected an object with sections {', '.join(SECTIONS)}")
    sections = {}
    for name, values in d.items():
        if name not in SECTIONS:
            raise ConfigError(f"{where}: unknown config section {name!r} (have: {', '.join(SECTIONS)})"
                              f"{_closest(name, SECTIONS)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: section {name!r} must be an object")
        values = _new_keys(name, values, where)
        known = {f.name for f in fields(SECTIONS[name])}
        for key in values:
            if key not in known:
                raise ConfigError(f"{where}: unknown config key '{name}.{key}'{_closest(key, known, name + '.')}")
        sections[name] = replace(getattr(cfg, name), **values)
    return replace(cfg, **sections)


def _new_keys(section: str, values: dict, where: str) -> dict:
    """A section's {key: value} with its old key names (`OLD_KEYS`) replaced by the new ones."""
    renamed = OLD_KEYS.get(section, {})
    if not renamed.keys() & values.keys():
        return values
    out = {}
    for key, value in values.items():
        new = renamed.get(key, key)
        if new in out or (new != key and new in values):
            raise ConfigError(f"{where}: '{section}.{key}' is the old name of '{section}.{new}'; give one of them")
        out[new] = value
    return out


def _field_name(section: str, name: str) -> str:
    """The field a key of `section` names: itself, or the new name of an old one (`OLD_KEYS`)."""
    return OLD_KEYS.get(section, {}).get(name, name)


def apply_overrides(cfg: RunConfig, overrides: list[str] | dict[str, str]) -> RunConfig:
    """Apply `section.key=value` strings (or a {"section.key": "value"} mapping)."""
    items = overrides.items() if isinstance(overrides, dict) else [_split(o) for o in overrides]
    nested: dict[str, dict] = {}
    for key, text in items:
        section, _, name = key.partition(".")
        nested.setdefault(section, {})[name] = parse_setting(key, text)
    return apply_dict(cfg, nested, where="override")


def parse_setting(key: str, text: str, where: str | None = None):
    """The value of command-line text for config key `key` ("train.batch_size"), parsed as that
    field's type; `where` names the option in errors (default: the key)."""
    section, _, name = key.partition(".")
    name = _field_name(section, name)
    if section not in SECTIONS or name not in {f.name for f in fields(SECTIONS[section])}:
        raise ConfigError(f"{where + ': ' if where else ''}unknown config key '{key}'{_closest(key, config_keys())}")
    return parse_value(text, _hints(SECTIONS[section])[name], where or key)


def apply_settings(cfg: RunConfig, settings: dict[str, object]) -> RunConfig:
    """Apply typed {"section.key": value} settings (as an experiment's jobs hold them); each
    value is checked against its field's type on construction, as a config file's are."""
    nested: dict[str, dict] = {}
    for key, value in settings.items():
        section, _, name = key.partition(".")
        if section not in SECTIONS or _field_name(section, name) not in {f.name for f in fields(SECTIONS[section])}:
            raise ConfigError(f"unknown config key '{key}'{_closest(key, config_keys())}")
        nested.setdefault(section, {})[name] = value
    return apply_dict(cfg, nested, where="settings")


def config_keys() -> list[str]:
    """Every `section.key` a run config has."""
    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)]


def _closest(name: str, known, prefix: str = "") -> str:
    """' (did you mean X?)' for the known name closest to a mistyped one, else ''."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def _split(override: str) -> tuple[str, str]:
    key, eq, value = override.removeprefix("--").partition("=")
    if not eq:
        raise ConfigError(f"override {override!r} must look like section.key=value")
    return key, value


def load_config_file(path: str | Path, base: RunConfig | None = None) -> RunConfig:
    path = Path(path)
    text = read_bytes(path, ConfigError, "config file")
    try:
        d = tomllib.loads(text.decode()) if path.suffix == ".toml" else parse_json(text, str(path), ConfigError)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'} "
                          f"({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config file") from None
    return apply_dict(base or RunConfig(), d, where=str(path))


RUN_CONFIG_FILE = "config.json"
"""The file in a run folder that records its whole RunConfig (written when the run starts)."""


def read_run_config(run_dir: str | Path, error: type[RlmlabError] = ConfigError) -> RunConfig:
    """The RunConfig a run folder's config.json records: all three sections, as a run writes
    them, read through `apply_dict`, so a file saved under old key names (`OLD_KEYS`) is
    migrated here and nowhere else. A missing, malformed, partial or invalid file is a
    one-line `error` naming it."""
    path = Path(run_dir) / RUN_CONFIG_FILE
    d = parse_json(read_bytes(path, error, RUN_CONFIG_FILE), str(path), error)
    if not isinstance(d, dict) or sorted(d) != sorted(SECTIONS):
        raise error(f"{path}: not a run's configuration (a run writes the sections {', '.join(SECTIONS)})")
    try:
        return apply_dict(RunConfig(), d, where=str(path))
    except ConfigError as e:
        raise error(str(e) if str(path) in str(e) else f"{path}: {e}") from None


def changed_keys(a: RunConfig, b: RunConfig) -> list[str]:
    da, db = a.to_dict(), b.to_dict()
    return [f"{s}.{k}" for s in da for k in da[s] if da[s][k] != db[s][k]]

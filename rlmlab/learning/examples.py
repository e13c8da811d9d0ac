"""Training examples: what each learner reads of the same executions (paper appendix "Training formats").

A learner's packing is a function `Execution -> list[Example]`; CoT and RM differ only here, never in the
model or the trainer. An `Example` is a token sequence plus a per-token loss mask: `loss[i]`
says that token i is a target, predicted from tokens[:i]. No packing adds <bos>/<eos>: a
CoT example starts with the written expression, an RM example with its frame, and a trace
ends when the root's `</return>` closes it, which the inference driver detects by itself.

- "cot": one example per expression, the whole flattened trace; loss on every token after
  the written expression.
- "rm": the active-frame examples (spec: docs/trace-format.md); loss on the targets
  after each frame's boundary m, never on the visible context. The examples of each frame
  instance are lane-packed into one sequence (`rlmlab.learning.lanes`), which computes exactly what
  they compute one by one; "rm-frames" keeps them as separate examples (the reference, ~1.7x
  the tokens).

- any other observation function of `rlmlab.learning.observe` by name, with its parameter:
  "window:K" (the last K tokens), "reduce" (PENCIL-style reduction): the examples that
  `Observation.examples` cuts, plain causal (docs/observation.md).

Packings with a layout register in `PACKINGS`; `get_packing` resolves every learner name.
`build_examples`, the row packer (`rlmlab.learning.packing`) and the trainer only see ids and masks.

`ExampleSet` is a learner's examples for a whole expression list, flattened into numpy arrays
(ids, loss mask, offsets, source expression), cached as .npz (never pickle;
`rlmlab.learning.example_cache`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlmlab.attention.position_index import frame_positions, other_index
from rlmlab.errors import ConfigError, DataError, RlmlabError
from rlmlab.learning.example_cache import arrays_digest, entry_path, read_examples, write_examples
from rlmlab.learning.lanes import lane_pack
from rlmlab.learning.observe import Observation, observer
from rlmlab.task.library import Library
from rlmlab.task.taskfile import Task
from rlmlab.task.trace import Execution, execute
from rlmlab.task.vocab import Vocab


@dataclass(frozen=True)
class Example:
    """One training sequence: `loss[i]` marks token i as a target (predicted from tokens[:i])."""

    tokens: tuple[str, ...]
    loss: tuple[bool, ...]
    layout: tuple[tuple[int, int, int], ...] | None = None
    """Per token (position, frame, branch) for sequences that are not one causal example at
    positions 0..n-1. The lane-packed RM packing: token i attends to j <= i of the same frame
    that is on the trunk (branch -1) or on i's branch, at position `position`. Frame -1 (no
    lanes): plain causal, at `position` (another `model.position_index`). None: plain causal,
    positions 0..n-1."""

    def __post_init__(self):
        if len(self.tokens) != len(self.loss):
            raise ValueError("an example needs one loss flag per token")
        if self.layout is not None and len(self.layout) != len(self.tokens):
            raise ValueError("an example's layout needs one entry per token")
        if self.loss and self.loss[0]:
            raise ValueError("the first token of an example has nothing to be predicted from")

    @property
    def loss_positions(self) -> list[int]:
        return [i for i, flag in enumerate(self.loss) if flag]

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(t for t, flag in zip(self.tokens, self.loss) if flag)


def _suffix_example(tokens: Sequence[str], boundary: int) -> Example:
    """Loss on tokens[boundary:], none on the first `boundary` (the visible context)."""
    return Example(tuple(tokens), (False,) * boundary + (True,) * (len(tokens) - boundary))


def cot_packing(ex: Execution) -> list[Example]:
    return [_suffix_example(ex.tokens, ex.prompt_len)]


def rm_frames_packing(ex: Execution) -> list[Example]:
    """The active-frame examples one by one: the reference form of the RM packing."""
    return [_suffix_example(f.tokens, f.m) for f in ex.frames]


def rm_lanes_packing(ex: Execution, index: str = "frame") -> list[Example]:
    """The active-frame examples of a trace lane-packed (`rlmlab.learning.lanes`): one example per frame
    instance, holding its trunk once and each pending call block once. Same targets and,
    exactly, the same logits as `rm_frames_packing`, in ~1.5x instead of ~2.6x the CoT packing's
    tokens.

    A frame's tokens never attend to another frame's, so each frame's lane is its own example:
    the packer puts lanes of many frames (and traces) into short rows, where a dense mask costs
    little, instead of one long row per trace whose mask is mostly zeros.

    `index` "trace" places every lane token where it was written in the flattened trace instead
    of where it sits in its frame (`rlmlab.attention.position_index`).
    """
    lanes = lane_pack(ex.tokens, ex.prompt_len)
    pos = lanes.flat if index == "trace" else lanes.pos
    targets = {i + 1 for i, label in enumerate(lanes.labels) if label is not None}
    out, start = [], 0
    for end in range(1, len(lanes) + 1):
        if end < len(lanes) and lanes.frame[end] == lanes.frame[start]:
            continue
        # Frames are laid out one after another; a frame's first token is an input (its call
        # payload), so no target ever crosses from one frame's lane into the next.
        out.append(Example(tuple(lanes.tokens[start:end]), tuple(i in targets for i in range(start, end)),
                           tuple(zip(pos[start:end], lanes.frame[start:end], lanes.branch[start:end]))))
        start = end
    return out


Packing = Callable[[Execution], list[Example]]
PACKINGS: dict[str, Packing] = {"cot": cot_packing, "rm": rm_lanes_packing, "rm-frames": rm_frames_packing}


def cot_frame_indexed_packing(ex: Execution) -> list[Example]:
    """CoT's one example per trace, each token at its "frame" index (no lanes: plain causal)."""
    (example,) = cot_packing(ex)
    return [Example(example.tokens, example.loss,
                    tuple((p, -1, -1) for p in frame_positions(ex.tokens, ex.prompt_len)))]


def rm_trace_indexed_packing(ex: Execution) -> list[Example]:
    """RM's lane-packed examples, each token at its "trace" index."""
    return rm_lanes_packing(ex, "trace")


INDEXED_PACKINGS: dict[tuple[str, str], Packing] = {("cot", "frame"): cot_frame_indexed_packing,
                                                    ("rm", "trace"): rm_trace_indexed_packing}


def indexed_packing(name: str, index: str | None) -> Packing:
    """The packing of learner `name` with tokens at position index `index` (None or the
    learner's own: its packing as it is). A learner without that index: a one-line ConfigError."""
    packing = get_packing(name)
    index = other_index(observer(name).name, index)
    if index is None:
        return packing
    if (name, index) not in INDEXED_PACKINGS:
        raise ConfigError(f"model.position_index={index} is not implemented for the {name!r} packing "
                          f"(have: {', '.join(f'{n} with {i}' for n, i in INDEXED_PACKINGS)})")
    return INDEXED_PACKINGS[name, index]


def observation_packing(obs: Observation) -> Packing:
    """The packing of an observation function: its plain examples, loss on the targets."""

    def packing(ex: Execution) -> list[Example]:
        return [_suffix_example(toks, m) for toks, m in obs.examples(ex.tokens, ex.prompt_len)]

    packing.__name__ = packing.__qualname__ = f"{obs.name}_packing"
    return packing


def get_packing(name: str) -> Packing:
    """The packing of the learner called `name`: a registered one (`PACKINGS`) or an observation
    function with its parameter ("window:256", "reduce"). Unknown: a one-line ConfigError."""
    if name in PACKINGS:
        return PACKINGS[name]
    if isinstance(name, str) and name.startswith("rm-"):
        raise ConfigError(f"unknown learner {name!r}: the RM packings are {', '.join(v for v in PACKINGS if v.startswith('rm'))}")
    return observation_packing(observer(name))


@dataclass(frozen=True)
class ExampleSet:
    """A learner's training examples for a list of expressions, as flat arrays.

    Example i is ids[offsets[i]:offsets[i+1]] with loss mask loss[same slice]; it comes from
    expression number source[i] of the list it was built from.
    """

    learner: str  # the learner (without encoding) whose packing built them: "rm", "cot", ...
    vocab: Vocab
    ids: np.ndarray  # (N_tokens,) uint16 token ids
    loss: np.ndarray  # (N_tokens,) bool, True = target
    offsets: np.ndarray  # (n_examples + 1,) int64
    source: np.ndarray  # (n_examples,) int64 index of the source expression
    n_expressions: int
    layout: np.ndarray | None = None  # (N_tokens, 3) int32 (position, frame, branch); see Example

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per example."""
        return np.diff(self.offsets)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def n_targets(self) -> int:
        return int(self.loss.sum())

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.ids[a:b], self.loss[a:b]

    def decode(self, i: int) -> Example:
        ids, loss = self.example(i)
        layout = None
        if self.layout is not None:
            layout = tuple(map(tuple, self.layout[self.offsets[i]:self.offsets[i + 1]].tolist()))
        return Example(tuple(self.vocab.decode(ids.tolist())), tuple(bool(x) for x in loss), layout)

    @property
    def positions_needed(self) -> np.ndarray:
        """Per example, the positional-table size it needs (largest position read + 1)."""
        if self.layout is None:
            return self.lengths - 1
        return np.maximum.reduceat(self.layout[:, 0], self.offsets[:-1]) + 1

    def select(self, keep: np.ndarray) -> "ExampleSet":
        """The examples where `keep` (bool, one per example) is True, in their order."""
        keep = np.asarray(keep, dtype=bool)
        if keep.all():
            return self
        lengths = self.lengths[keep]
        token_keep = np.repeat(keep, self.lengths)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return ExampleSet(self.learner, self.vocab, self.ids[token_keep], self.loss[token_keep], offsets,
                        self.source[keep], self.n_expressions,
                        None if self.layout is None else self.layout[token_keep])

    def save(self, path: str | Path) -> None:
        """Write to .npz atomically (`rlmlab.learning.example_cache`)."""
        write_examples(path, self.learner, self.vocab, self.n_expressions, self.digest(), self.arrays)

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays by name, the layout only where there is one."""
        out = {"ids": self.ids, "loss": self.loss, "offsets": self.offsets, "source": self.source}
        return out if self.layout is None else {**out, "layout": self.layout}

    def digest(self) -> str:
        """SHA-256 of the arrays: a cache damaged inside its arrays still parses, and would
        otherwise train silently on other tokens or targets."""
        return arrays_digest(self.ids, self.loss, self.offsets, self.source, self.layout)

    @classmethod
    def load(cls, path: str | Path) -> "ExampleSet":
        """Read a file `save` wrote, every array checked (`read_examples`); its digest must match."""
        fields, digest = read_examples(path)
        data = cls(**fields)
        if digest != data.digest():
            raise DataError(f"{path}: its arrays do not match their SHA-256 (damaged)")
        return data


MAX_ECHO = 160  # characters of a user's expression quoted in an error


def _encode_chunk(args: tuple[str, tuple[str, ...], int, Sequence[str], Sequence[str] | None, Library,
                             str | None]) -> tuple[np.ndarray, ...]:
    """Execute and encode a chunk of expressions; runs in worker processes."""
    name, vocab_tokens, first, texts, where, library, index = args
    packing, vocab = indexed_packing(name, index), Vocab(vocab_tokens)
    ids: list[int] = []
    loss: list[bool] = []
    lengths: list[int] = []
    source: list[int] = []
    layout: list[tuple[int, int, int]] = []
    for k, text in enumerate(texts):
        try:
            examples = packing(execute(text, library))
        except RlmlabError as e:
            shown = text if len(text) <= MAX_ECHO else text[:MAX_ECHO] + "..."
            place = where[k] if where is not None else f"expression {first + k}"
            raise DataError(f"{place} ({shown!r}): {str(e)[:2 * MAX_ECHO]}") from None
        for ex in examples:
            ids.extend(vocab.encode(ex.tokens))
            loss.extend(ex.loss)
            lengths.append(len(ex.tokens))
            source.append(first + k)
            if ex.layout is not None:
                layout.extend(ex.layout)
    if layout and len(layout) != len(ids):
        raise ValueError(f"the packing of {name!r} gives a layout for some examples only")
    return (np.array(ids, dtype=np.uint16), np.array(loss, dtype=bool), np.array(lengths, dtype=np.int64),
            np.array(source, dtype=np.int64), np.array(layout, dtype=np.int32).reshape(-1, 3))


def build_examples(exprs: Sequence[str], learner: str, vocab: Vocab, workers: int = 1,
                    cache_dir: str | Path | None = None, chunk: int = 2048,
                    where: Sequence[str] | None = None, *, task: Task,
                    position_index: str | None = None) -> ExampleSet:
    """Execute every expression of `task` and return the training
    examples of `learner` (a name without encoding: "rm", "cot", "window:64") as one `ExampleSet`. `where` names each expression's place in the user's file for errors
    (default: its index in `exprs`). `position_index` places the tokens at another index than the
    learner's own (`model.position_index`, `indexed_packing`).

    With `cache_dir`, the result is stored as `<learner>-<hash>.npz` keyed by the expressions,
    learner and vocabulary, and read back on the next call instead of being rebuilt.
    """
    indexed_packing(learner, position_index)  # an unknown learner or index: one line, before any work
    position_index = other_index(observer(learner).name, position_index)  # its own index keys as None
    if len(vocab) > np.iinfo(np.uint16).max:
        raise DataError(f"vocabulary of {len(vocab)} tokens does not fit uint16 ids")
    exprs = list(exprs)
    cache_path = entry_path(cache_dir, exprs, learner, vocab, task, position_index) if cache_dir else None
    if cache_path is not None and cache_path.exists():
        try:
            return ExampleSet.load(cache_path)
        except DataError:
            pass  # a stale or damaged cache entry is rebuilt below and overwritten
    jobs = [(learner, vocab.tokens, i, exprs[i:i + chunk], None if where is None else list(where[i:i + chunk]),
             task.library, position_index)
            for i in range(0, len(exprs), chunk)]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(min(workers, len(jobs))) as ex:
            parts = list(ex.map(_encode_chunk, jobs))
    else:
        parts = [_encode_chunk(j) for j in jobs]
    if not parts:
        raise DataError("no expressions to build training examples from")
    ids, loss, lengths, source, layout = (np.concatenate(p) for p in zip(*parts))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = ExampleSet(learner, vocab, ids, loss, offsets, source, len(exprs), layout if len(layout) else None)
    if cache_path is not None:
        data.save(cache_path)
    return data

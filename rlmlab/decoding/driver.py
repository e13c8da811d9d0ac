"""Greedy decoding for every learner: one driver, any observation function.

`generate(predictor, exprs, vocab, learner)` runs many expressions at once. Each expression is a
*row*: its flattened trace grows one token per step, and a `TraceReader` keeps the frame
stack, decides legality and notices when the root's return block closes. What the row shows
the predictor is the learner's observation of that trace:

- CoT: the whole flattened trace so far;
- RM: the active (top) frame only. On `</call>` the payload q becomes a new frame; on
  `</return>` with a parent below, the frame is popped and its payload appended to the parent.
- any other observation of `rlmlab.learning.observe` ("window:K", "reduce"): its `Tracker` says how
  the observation and the reusable cache prefix (`Feed.keep`) change on each token.

Rows live in a fixed number of *slots* (continuous batching: a finished row's slot takes the
next expression at once). The predictors are `rlmlab.decoding.engine.ModelPredictor` (a
Transformer) and the oracles of `rlmlab.decoding.oracle`.

Whatever a predictor emits, the driver does not raise: an illegal token, a special token, a
stack deeper than the limit, a frame or trace longer than the model can read or longer than
the limits ends that row as invalid with the reason, and the other rows go on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlmlab.attention.position_index import indexed_tracker, other_index
from rlmlab.decoding.predictor import NO_TOKEN, Feed, Predictor
from rlmlab.errors import ConfigError
from rlmlab.learning.observe import Tracker, observer
from rlmlab.task.events import DONE, ERROR, PUSH, TraceReader
from rlmlab.task.expr import Call, parse, to_text
from rlmlab.task.expr import tokens as expr_tokens
from rlmlab.task.library import Library
from rlmlab.task.trace import trace_stats
from rlmlab.task.vocab import Vocab


@dataclass(frozen=True)
class Limits:
    """When a row stops as invalid. Apply to the produced trace whatever the learner, so that the
    two learners' outputs end for the same reasons."""

    max_depth: int = 64
    """Frames on the stack (the root is depth 1); the paper's generator reaches about 23."""
    max_frame_tokens: int | None = None
    """Tokens of the active frame, visible plus generated (None: no limit beyond what the
    predictor can read, its block size)."""
    max_new_tokens: int | None = None
    """Generated trace tokens. None: scaled to each expression, `runaway_factor` times the tokens
    its canonical trace generates plus `RUNAWAY_SLACK`, so that a model that never closes the
    root stops after a few times the work a right answer takes (the driver writes the flattened
    trace whatever the learner, so the bound is the same for RM and CoT)."""
    runaway_factor: int = 8
    """The scale of that per-expression bound. The canonical trace fits under any factor >= 1;
    the factor sets how far a row may stray from it (a longer trace may still end in the right
    answer) before it is cut, and so the decoding time of models whose rows no block size stops
    (no positional table)."""

    def __post_init__(self):
        if not isinstance(self.runaway_factor, int) or isinstance(self.runaway_factor, bool) \
                or self.runaway_factor < 1:
            raise ConfigError(f"runaway_factor must be a positive integer, got {self.runaway_factor!r}")

    def row_cap(self, expr: Call, prompt_len: int, library: Library) -> int:
        """The most trace tokens a row of `expr` may generate."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return self.runaway_factor * (trace_stats(expr, library).trace_len - prompt_len) + RUNAWAY_SLACK


RUNAWAY_SLACK = 64


@dataclass
class Generation:
    """One expression's decoding outcome."""

    expr: str
    tokens: list[str]  # the flattened trace produced, written expression first; an invalid row
    # ends with the token that stopped it (an id outside the vocabulary shows as "<id N>")
    prompt_len: int
    answer: str | None  # the root's returned payload, space-joined, if the root returned
    valid: bool
    reason: str | None  # why the row stopped as invalid
    max_depth: int
    n_frame_examples: int  # active-frame examples cut (= frames of the paper's table on a full trace)
    fed: int  # tokens the predictor was fed (prefills included): the decoding cost

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.prompt_len


class _Row:
    __slots__ = ("i", "slot", "text", "replay", "prompt", "out", "obs", "fed", "cap")

    def __init__(self, i: int, slot: int, expr: Call, vocab: Vocab, obs, limits: Limits, library: Library,
                 index: str | None = None):
        prompt = expr_tokens(expr)
        self.i, self.slot, self.text = i, slot, to_text(expr)
        self.cap = limits.row_cap(expr, len(prompt), library)
        self.replay = TraceReader(prompt)
        self.prompt = prompt
        self.out: list[int] = []  # generated ids
        # seq, keep, event of the observation; and pos, where `index` is another than its own
        self.obs: Tracker = indexed_tracker(obs.tracker(vocab.encode(prompt), vocab), obs.name, index, len(prompt))
        self.fed = 0


def generate(predictor: Predictor, exprs: Sequence[str | Call], vocab: Vocab, learner: str,
             limits: Limits = Limits(), batch_size: int | None = None,
             progress: Callable[[int], None] | None = None, longest_first: bool = True,
             *, library: Library) -> list[Generation]:
    """Greedy-decode every expression as `learner` reads it, `batch_size` rows at a time (default: the
    predictor's `default_slots`, 256 for a model on CUDA, else 64); results in input order.

    `exprs` are written expressions (text or parsed) of `library`'s task;
    `progress(k)` is called as k rows finish.
    With `longest_first` the expressions with the longest canonical traces enter the slots
    first: rows are independent, so this changes no result, only shortens the run's tail (a
    long trace started last would decode alone at the end).
    """
    obs = observer(learner)
    index = getattr(predictor, "position_index", None)
    other_index(obs.name, index)  # a learner without that index: one line, before any row starts
    calls = [e if isinstance(e, Call) else parse(e, library) for e in exprs]
    order = list(range(len(calls)))
    if longest_first:
        order.sort(key=lambda i: -trace_stats(calls[i], library).trace_len)
    block = predictor.block_size
    max_frame = limits.max_frame_tokens
    toks = vocab.tokens
    n_vocab = len(toks)
    results: list[Generation | None] = [None] * len(exprs)
    todo = iter(order)
    if batch_size is None:
        batch_size = getattr(predictor, "default_slots", 64)
    n_slots = max(1, min(batch_size, len(exprs)))
    slots: list[_Row | None] = [None] * n_slots
    predictor.reset(n_slots)

    def finish(row: _Row, reason: str | None) -> None:
        r = row.replay
        trace = row.prompt + [toks[t] if 0 <= t < n_vocab else f"<id {t}>" for t in row.out]
        answer = " ".join(r.answer) if reason is None and r.answer is not None else None
        results[row.i] = Generation(row.text, trace, len(row.prompt), answer, reason is None,
                                    reason, r.max_depth, r.n_cuts, row.fed)
        slots[row.slot] = None

    def advance(row: _Row, t: int) -> str | None:
        """Append the predicted token; returns why the row stops, "" when it is done, else None."""
        row.out.append(t)
        if not 0 <= t < n_vocab:
            return "predictor returned no token" if t == NO_TOKEN else f"token id {t} outside the vocabulary"
        r = row.replay
        event = r.feed(toks[t])
        if event == ERROR:
            return r.error
        if event == DONE:
            return ""
        if len(row.out) > row.cap:
            return f"more than {row.cap} generated tokens"
        if event == PUSH and r.depth > limits.max_depth:
            return f"deeper than {limits.max_depth} frames"
        if max_frame is not None and len(r.top) > max_frame:
            return f"active frame longer than {max_frame} tokens"
        row.obs.advance(t, event, r)
        return None

    while True:
        for s in range(n_slots):
            if slots[s] is None:
                i = next(todo, None)
                if i is None:
                    break
                slots[s] = _Row(i, s, calls[i], vocab, obs, limits, library, index)
        live = [row for row in slots if row is not None]
        if not live:
            break
        done = 0
        feeds = []
        for row in live:
            o = row.obs
            pos = getattr(o, "pos", None)
            if block is not None and pos is None and len(o.seq) > block:
                finish(row, f"{obs.context_word} of {len(o.seq)} tokens exceeds the model's block size {block}")
                done += 1
                continue
            if block is not None and pos is not None and max(pos[o.keep:], default=0) >= block:
                finish(row, f"{obs.context_word} reaches position {max(pos[o.keep:])}, beyond the model's "
                       f"block size {block}")
                done += 1
                continue
            feeds.append(Feed(row.slot, o.seq, o.keep, o.event, pos))
            row.fed += len(o.seq) - o.keep
        if feeds:
            for f, t in zip(feeds, predictor(feeds)):
                row = slots[f.slot]
                stop = advance(row, t)
                if stop is not None:
                    finish(row, stop or None)
                    done += 1
        if progress is not None and done:
            progress(done)
    return results

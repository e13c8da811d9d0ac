"""Observation functions: what a learner reads of the complete sequence (paper, "Observation-function view").

An observation function Pi maps the complete token sequence accumulated so far (the written
expression, `prompt_len` tokens, then every emitted token) to the visible context the
predictor reads before choosing the next token; it is idempotent, Pi(Pi(x)) = Pi(x). The
reference definition of each is `Observation.observe(tokens, prompt_len)`. Everything else
follows from it and is tested against it:

- training examples (`Observation.examples`): at every prediction point t the model reads
  Pi(x[:t]) and is trained to emit x[t]. Consecutive points whose visible context just grew
  by the emitted token share one example (context, then targets); a point whose context was
  rewritten starts a new one. `reference_examples` is that construction literally (O(n^2),
  for tests); each observation computes the same list in one pass.
- the driver (`Observation.tracker`): how the observation `seq` and the reusable cache prefix
  `keep` of an inference row evolve token by token (see `rlmlab.decoding.predictor.Feed`).

Shipped observations (names as `--learner` takes them):

- "cot": the identity. One example per trace; the driver appends, the KV cache only grows.
- "rm" (also its training packings "rm-frames", "rm-..."): the active-frame map Pi_rec. One
  example per active-frame segment; the driver pushes and pops frames, parking the parent's
  keys/values (events PUSH/POP).
- "window:K": the last K tokens, *re-indexed from position 0*: the predictor reads the plain
  token list x[-K:], as the paper's Pi: Omega -> Omega requires, so it cannot tell how long
  the hidden part is. The price: once the trace is longer than K every target has its own
  example of K context tokens (training costs ~K tokens per target instead of ~1), and the
  driver re-feeds the whole window each step (keep = 0: no cache reuse once the window slides).
- "reduce": PENCIL-style reduction. Every completed call block, from `<call>` through the
  child's closing `</return>`, is replaced in place by the child's returned value; the
  parent's context stays inline, and so does the open call stack (the caller's text, then
  `<call> q </call>`, then the child's work so far). One example per completed call (plus the
  last); the driver appends and, on a return, cuts the sequence back to where `<call>` stood
  and appends the value: the prefix before it is unchanged, so the KV cache stays valid.

For every legal prefix x, Pi_rec(Pi_reduce(x)) = Pi_rec(x) (the reduction collapses exactly
what the stack replay pops), so g* o Pi_rec runs in the reduction's driver too.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from rlmlab.errors import ConfigError
from rlmlab.task.events import CALL_BLOCK_EXTRA, POP, PUSH, TraceReader
from rlmlab.task.frames import active_frame, cut_examples

# A training example as (tokens, m): the model reads tokens[:i] to predict tokens[i] for every
# i >= m; tokens[:m] is visible context only.
Segment = tuple[tuple[str, ...], int]

# Frame events a driver feed carries, so that a cache can follow the row (see rlmlab.decoding.predictor):
# the replay's PUSH and POP, and NEW for a row that starts in its slot.
NEW = "new"


class Tracker(ABC):
    """One inference row's observation, updated token by token.

    `seq` is the observation (token ids), `keep` how many of its leading tokens were already
    shown to the predictor and are unchanged, `event` NEW / PUSH / POP / None for caches that
    follow a frame stack. `advance(t, event, replay)` is called after the row's `TraceReader`
    has accepted token id t (`event` is what `TraceReader.feed` returned: None, push or pop).
    """

    seq: list[int]
    keep: int
    event: str | None

    @abstractmethod
    def advance(self, t: int, event: str | None, replay: TraceReader) -> None:
        """Take token id t into the observation (update seq, keep, event)."""


class Observation(ABC):
    """An observation function Pi and what follows from it. Subclasses define `observe`,
    `examples` and `tracker`; `name` is the canonical `--learner` spelling."""

    name: str
    family: str = "cot"
    """Which model preset column fits its contexts: "cot" (whole-trace length) or "rm" (short)."""
    context_bound: int | None = None
    """Longest visible context whatever the trace (None: unbounded)."""
    row_length: int = 512
    """Base packed-row length of its training batches: short rows for short examples (a dense
    mask costs attention over the whole row; an active-frame example averages ~30 tokens)."""
    context_word: str = "observation"
    """What a too-long visible context is called in a decoding error."""
    shows_active_frame: bool = False
    """Whether the observation is the active frame itself (Pi = Pi_rec): the true rule then reads
    it as it is, with no stack replay of its own."""

    @property
    def label(self) -> str:
        """Its name in tables."""
        return self.name

    @abstractmethod
    def observe(self, tokens: Sequence[str], prompt_len: int = 0) -> list[str]:
        """The reference: the visible context when the complete sequence is `tokens`."""

    @abstractmethod
    def examples(self, tokens: Sequence[str], prompt_len: int) -> list[Segment]:
        """The training examples of a sequence whose first `prompt_len` tokens are given (no
        target): equal to `reference_examples(self, tokens, prompt_len)`, in one pass."""

    @abstractmethod
    def tracker(self, prompt: list[int], vocab) -> Tracker:
        """The driver state of a new row whose written expression is `prompt` (ids)."""

    def __repr__(self) -> str:
        return f"<observation {self.name}>"


def reference_examples(obs: Observation, tokens: Sequence[str], prompt_len: int) -> list[Segment]:
    """The training examples, literally from `observe` at every prediction point (O(n^2)).

    Point t (t = prompt_len .. n-1) reads v_t = Pi(x[:t]) and predicts x[t]. If v_t is
    v_{t-1} followed by x[t-1], the point continues the current example; otherwise it opens a
    new example whose context is v_t."""
    out: list[Segment] = []
    cur: list[str] | None = None
    m = 0
    for t in range(prompt_len, len(tokens)):
        v = obs.observe(tokens[:t], prompt_len)
        if cur is not None and v == cur:
            cur.append(tokens[t])
            continue
        if cur is not None:
            out.append((tuple(cur), m))
        cur, m = list(v) + [tokens[t]], len(v)
    if cur is not None:
        out.append((tuple(cur), m))
    return out


# --- identity (CoT) -------------------------------------------------------------------------


class _Growing(Tracker):
    """The observation only grows by the emitted token (the whole trace)."""

    def __init__(self, prompt: list[int]):
        self.seq, self.keep, self.event = list(prompt), 0, NEW

    def advance(self, t, event, replay):
        self.keep, self.event = len(self.seq), None
        self.seq.append(t)


class Identity(Observation):
    name = "cot"
    label = "CoT"
    context_word = "trace"

    def observe(self, tokens, prompt_len=0):
        return list(tokens)

    def examples(self, tokens, prompt_len):
        return [(tuple(tokens), prompt_len)] if len(tokens) > prompt_len else []

    def tracker(self, prompt, vocab):
        return _Growing(prompt)


# --- active frame (RM) ----------------------------------------------------------------------


class _FrameStack(Tracker):
    """The active frame; on a push the parent's ids are kept aside, on a pop they come back
    with the returned payload appended (a cache parks and restores the parent, PUSH/POP)."""

    def __init__(self, prompt: list[int]):
        self.seq, self.keep, self.event = list(prompt), 0, NEW
        self.parents: list[list[int]] = []

    def advance(self, t, event, replay):
        self.keep, self.event = len(self.seq), None
        if event is None:
            self.seq.append(t)
        elif event == "push":
            start = len(replay.stack[-2].tokens)  # the parent keeps its tokens before <call>
            q = self.seq[start + 1:]
            del self.seq[start:]
            self.parents.append(self.seq)
            self.seq, self.keep, self.event = q, 0, PUSH
        else:  # pop: the child's seq ends with <return> a; the parent gets a
            parent = self.parents.pop()
            a = self.seq[len(self.seq) - len(replay.value):]
            self.keep = len(parent)
            parent.extend(a)
            self.seq, self.event = parent, POP


class ActiveFrame(Observation):
    name = "rm"
    label = "RM"
    family = "rm"
    row_length = 128
    context_word = "active frame"
    shows_active_frame = True

    def observe(self, tokens, prompt_len=0):
        return active_frame(tokens)

    def examples(self, tokens, prompt_len):
        return [(f.tokens, f.m) for f in cut_examples(tokens, prompt_len)]

    def tracker(self, prompt, vocab):
        return _FrameStack(prompt)


# --- sliding window -------------------------------------------------------------------------


class _Sliding(Tracker):
    """The last k ids: grows until the trace is k long, then a fresh window every step."""

    def __init__(self, prompt: list[int], k: int):
        self.k = k
        self.trace = list(prompt)
        self.seq, self.keep, self.event = self.trace[-k:], 0, NEW

    def advance(self, t, event, replay):
        self.event = None
        self.trace.append(t)
        if len(self.trace) <= self.k:
            # Still the whole trace: seq and trace are one list, the cache prefix is valid.
            self.seq, self.keep = self.trace, len(self.trace) - 1
        else:
            # Every token has moved one position down: nothing cached is valid (re-indexed).
            self.seq, self.keep = self.trace[-self.k:], 0


@dataclass(frozen=True, eq=False, repr=False)
class Window(Observation):
    k: int
    family = "rm"

    @property
    def name(self) -> str:
        return f"window:{self.k}"

    @property
    def context_bound(self) -> int:
        return self.k

    def observe(self, tokens, prompt_len=0):
        return list(tokens[max(0, len(tokens) - self.k):])

    def examples(self, tokens, prompt_len):
        tokens, k, n = tuple(tokens), self.k, len(tokens)
        out: list[Segment] = []
        first = prompt_len
        if prompt_len <= k:
            # Points t <= k read the whole prefix x[:t]: one growing example.
            end = min(n, k + 1)
            if end > prompt_len:
                out.append((tokens[:end], prompt_len))
            first = k + 1
        # Every later point reads x[t-k:t], a window of its own.
        out.extend((tokens[t - k:t + 1], k) for t in range(max(first, prompt_len), n))
        return out

    def tracker(self, prompt, vocab):
        return _Sliding(prompt, self.k)


# --- PENCIL-style reduction -----------------------------------------------------------------


def _collapses(tokens: Sequence[str], out: list[str]):
    """Reduce `tokens` into `out`, collapsing each completed call block `<call> q </call> ...
    <return> a </return>` (the child's closing return) to `a` in place. Yields, each time a
    call completes, the sequence as it stood just before the collapse (`out` then holds the
    collapsed one). The pushes and pops are those of Pi_rec's own replay (`TraceReader`
    outside the legal mode), so both maps agree on what a completed call is on any sequence.
    Nothing is yielded per token: the examples only change where a call completes."""
    calls: list[int] = []  # per open call: index of its <call> in `out`
    r = TraceReader(legal=False)
    feed = r.feed
    for tok in tokens:
        out.append(tok)
        ev = feed(tok)
        if ev is None:
            continue
        if ev == PUSH:
            calls.append(len(out) - len(r.top) - CALL_BLOCK_EXTRA)  # the call block ends `out`
        elif ev == POP:
            before = tuple(out)
            del out[calls.pop():]
            out.extend(r.value)
            yield before


def reduce_calls(tokens: Sequence[str]) -> list[str]:
    """Pi_reduce: every completed call block replaced by its returned value. Total on any sequence."""
    out: list[str] = []
    for _ in _collapses(tokens, out):
        pass
    return out


class _Reducing(Tracker):
    """Appends; when a child returns, cuts back to where its `<call>` stood and appends the
    value. The prefix before the cut is unchanged, so `keep` = the cut and a KV cache stays valid."""

    def __init__(self, prompt: list[int], vocab):
        self.seq, self.keep, self.event = list(prompt), 0, NEW
        self.calls: list[int] = []  # index in seq of each open call's <call>

    def advance(self, t, event, replay):
        self.event = None
        self.seq.append(t)
        self.keep = len(self.seq) - 1
        if event == "push":
            self.calls.append(len(self.seq) - len(replay.top) - CALL_BLOCK_EXTRA)
        elif event == "pop":
            seq = self.seq
            a = seq[len(seq) - 1 - len(replay.value):-1]  # `<return> a </return>` ends the child
            cut = self.calls.pop()
            del seq[cut:]
            seq.extend(a)
            self.keep = cut


class Reduce(Observation):
    name = "reduce"

    def observe(self, tokens, prompt_len=0):
        return reduce_calls(tokens)

    def examples(self, tokens, prompt_len):
        """One pass of the reduction: an example closes at each child's `</return>` (the
        context is rewritten right after it) and at the end. A written expression has no
        control token, so the prompt is its own reduction and completes no call."""
        out: list[Segment] = []
        seq: list[str] = []
        m = prompt_len
        for before in _collapses(tokens, seq):
            out.append((before, m))
            m = len(seq)
        if len(seq) > m:
            out.append((tuple(seq), m))
        return out

    def tracker(self, prompt, vocab):
        return _Reducing(prompt, vocab)


# --- names ----------------------------------------------------------------------------------

OBSERVATIONS = ("cot", "rm", "window:K", "reduce")
"""The observation names `observer` takes ("rm-..." training packings read as "rm")."""

_WINDOW = re.compile(r"window:([1-9][0-9]*)")


def observer(name) -> Observation:
    """The observation a learner name reads: "cot", "rm" (and its packings "rm-..."), "window:K"
    (K >= 1) or "reduce". An unknown name or a bad parameter is a one-line ConfigError. An
    observation, or a resolved `rlmlab.learning.learner.Learner`, is taken as it is."""
    if isinstance(name, Observation):
        return name
    if isinstance(getattr(name, "observation", None), Observation):  # a Learner
        return name.observation
    if not isinstance(name, str):
        raise ConfigError(f"a learner is named by a string, got {name!r}")
    if name == "cot":
        return Identity()
    if name == "rm" or name.startswith("rm-"):
        return ActiveFrame()
    if name == "reduce":
        return Reduce()
    if name.startswith("window"):
        m = _WINDOW.fullmatch(name)
        if m is None:
            raise ConfigError(f"unknown learner {name!r}: a window takes its size in tokens, e.g. window:256")
        return Window(int(m.group(1)))
    raise ConfigError(f"unknown learner {name!r} (have: {', '.join(OBSERVATIONS)}, and the RM packing rm-frames)")

"""The true next-token rule g* as a predictor, and the active-frame map that lets a frame
predictor run on whole traces."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from rlmlab.decoding.predictor import NO_TOKEN, Feed, Predictor
from rlmlab.learning.observe import NEW, POP, PUSH, observer
from rlmlab.task.events import TraceReader
from rlmlab.task.expr import parse
from rlmlab.task.frames import active_frame
from rlmlab.task.library import Library
from rlmlab.task.trace import execute
from rlmlab.task.vocab import Vocab


class _Match:
    """The examples of one frame's call that agree with the frame's first `n` tokens, in
    execution order: the next token is the next target of the first whose targets reach past `n`."""

    __slots__ = ("examples", "n")

    def __init__(self, examples: list[tuple[int, tuple[int, ...]]], frame: Sequence[int]):
        n = len(frame)
        head = tuple(frame)
        self.examples = [(m, toks) for m, toks in examples if len(toks) >= n and toks[:n] == head]
        self.n = n

    def extend(self, frame: Sequence[int]) -> None:
        """The frame grew by tokens appended after the first `n`."""
        n, new = self.n, tuple(frame[self.n:])
        end = n + len(new)
        self.examples = [(m, toks) for m, toks in self.examples if len(toks) >= end and toks[n:end] == new]
        self.n = end

    def next_id(self) -> int:
        n = self.n
        for m, toks in self.examples:
            if m <= n < len(toks):
                return toks[n]
        return NO_TOKEN


class Oracle:
    """The true next-token rule g* as a function of the active frame alone (an RM predictor).

    A frame starts with the written call q it evaluates. Executing q gives every active-frame
    example of q's frame (and, in passing, of every frame below it); the frame seen now is one
    of those examples' context plus a prefix of its targets, and the next token is the next
    target. Tables are built per distinct q on first sight. A frame that is not on q's
    canonical path (only a wrong predictor produces one) gets NO_TOKEN.
    """

    block_size = None

    def __init__(self, vocab: Vocab, library: Library, max_calls: int = 200_000):
        self.vocab = vocab
        self.library = library
        self.max_calls = max_calls
        self.open_id, self.close_id = vocab.ids["("], vocab.ids[")"]
        # A written call has only function names, literals, parentheses and commas, and its
        # frame continues with a parameter name or `return`: with byte-sized ids the call's
        # extent is one C-level regex match rather than a Python loop over it every step.
        call_ids = [i for i, t in enumerate(vocab.tokens)
                    if t in ("(", ")", ",") or t in library.literals or t in library]
        self.call_re = re.compile(b"[" + re.escape(bytes(call_ids)) + b"]*") if len(vocab) <= 256 else None
        # q (ids) -> [(m, example tokens)] for q's own frame, in execution order
        self.table: dict[tuple[int, ...], list[tuple[int, tuple[int, ...]]]] = {}
        self.frames: list[list[_Match | None]] = []  # per slot, its frames' matches, innermost last

    def reset(self, n_slots: int) -> None:
        """Forget the rows' frames (the tables only grow)."""
        self.frames = [[] for _ in range(n_slots)]

    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        return [self.step(f) for f in feeds]

    def step(self, f: Feed) -> int:
        """`next_id` of the feed's frame, kept per slot as the examples that still agree with
        it: a step that only appends tokens checks those against each example, so a frame of
        L tokens costs O(L) over its life rather than O(L) per step (O(L^2) for the root frame
        of a long expression). A parent frame is kept aside while its child runs, as the KV
        cache does, and re-matched when the child returns (the frame lost its call block)."""
        if f.slot >= len(self.frames):
            self.frames.extend([] for _ in range(f.slot + 1 - len(self.frames)))
        stack = self.frames[f.slot]
        if f.event == NEW:
            stack.clear()
        elif f.event == POP and stack:
            stack.pop()
        if f.event in (NEW, PUSH) or not stack:
            stack.append(None)
        match = stack[-1]
        seq = f.seq
        if match is None or f.keep < match.n or f.keep > len(seq):
            match = stack[-1] = self._match(seq)
        elif match.n < len(seq):
            match.extend(seq)
        return match.next_id()

    def _match(self, frame: Sequence[int]) -> "_Match":
        n = self._call_len(frame)
        if n is None:
            return _Match([], frame)
        q = tuple(frame[:n])
        examples = self.table.get(q)
        if examples is None:
            examples = self._learn(q)
        return _Match(examples, frame)

    def _call_len(self, frame: Sequence[int]) -> int | None:
        """Length of the written call that opens a frame (if the frame is well-formed, which
        the lookup checks by parsing it)."""
        if self.call_re is not None:
            return self.call_re.match(bytes(frame)).end() or None
        depth = 0
        for i, t in enumerate(frame):
            if t == self.open_id:
                depth += 1
            elif t == self.close_id:
                depth -= 1
                if depth == 0:
                    return i + 1
        return None

    def next_id(self, frame: tuple[int, ...]) -> int:
        n = self._call_len(frame)
        if n is None:
            return NO_TOKEN
        q = frame[:n]
        examples = self.table.get(q)
        if examples is None:
            examples = self._learn(q)
        n = len(frame)
        for m, toks in examples:
            if m <= n < len(toks) and toks[:n] == frame:
                return toks[n]
        return NO_TOKEN

    def _learn(self, q: tuple[int, ...]) -> list[tuple[int, tuple[int, ...]]]:
        if len(self.table) > self.max_calls:
            self.table.clear()  # bound memory on long runs; tables are rebuilt on demand
        try:
            ex = execute(parse(" ".join(self.vocab.decode(q)), self.library), self.library)
        except Exception:  # noqa: BLE001 - not a well-formed call: no rule applies
            self.table[q] = []
            return []
        by_call: dict[tuple[int, ...], list] = {}
        for f in ex.frames:
            toks = tuple(self.vocab.encode(f.tokens))
            fq = toks[:self._call_len(toks)]
            if fq not in self.table:
                by_call.setdefault(fq, []).append((f.m, toks))
        for fq, examples in by_call.items():
            # A call repeated in the tree contributes its (identical) examples once.
            self.table[fq] = list(dict.fromkeys(examples))
        return self.table[q]


class OnActiveFrame:
    """A frame predictor run on whole traces: g o Pi_rec, a CoT predictor.

    Pi_rec is kept incrementally per slot with a `TraceReader` (equal to `active_frame` on legal
    prefixes, tested in test_trace_properties); on an illegal prefix it falls back to
    `active_frame` itself, which is total. `frame` is a function of the frame's ids alone
    (each frame seen afresh), or an RM predictor fed the frame as the RM decoder would feed it:
    tokens appended to the same frame as such, a frame changed by a call or a return anew.
    """

    block_size = None

    def __init__(self, frame: Callable[[tuple[int, ...]], int] | Predictor, vocab: Vocab):
        self.inner = frame if hasattr(frame, "reset") else _EachFrame(frame)
        self.vocab = vocab
        self.replays: list[TraceReader | None] = []
        self.seen: list[int] = []
        self.frames: list[list[int]] = []  # per slot, the active frame's ids

    def reset(self, n_slots: int) -> None:
        self.replays = [None] * n_slots
        self.seen = [0] * n_slots
        self.frames = [[] for _ in range(n_slots)]
        self.inner.reset(n_slots)

    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        toks, ids = self.vocab.tokens, self.vocab.ids
        inner = []
        for f in feeds:
            r = self.replays[f.slot]
            fresh = r is None or f.event == NEW or f.keep < self.seen[f.slot]
            if fresh:
                r = self.replays[f.slot] = TraceReader()
                self.seen[f.slot] = 0
            new = f.seq[self.seen[f.slot]:]
            events = [r.feed(toks[t]) for t in new]
            moved = fresh or any(e is not None for e in events)  # a push, a pop or an error
            self.seen[f.slot] = len(f.seq)
            frame = self.frames[f.slot]
            if moved:
                top = r.top if r.error is None else active_frame(toks[t] for t in f.seq)
                frame[:] = map(ids.__getitem__, top)
                inner.append(Feed(f.slot, frame, 0, NEW))
            else:  # the tokens went onto the same frame
                keep = len(frame)
                frame.extend(new)
                inner.append(Feed(f.slot, frame, keep, None))
        return self.inner(inner)


class _EachFrame:
    """A function of the frame's ids as a predictor."""

    block_size = None

    def __init__(self, fn: Callable[[tuple[int, ...]], int]):
        self.fn = fn

    def reset(self, n_slots: int) -> None:
        pass

    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        return [self.fn(tuple(f.seq)) for f in feeds]


def oracle_predictor(learner: str, vocab: Vocab, library: Library) -> Predictor:
    """The oracle for a learner: g* on the active frame (RM), or g* o Pi_rec of whatever the learner
    shows (CoT, reduction: Pi_rec of the observation is Pi_rec of the trace, so it reproduces
    canonical traces; a window shorter than the trace hides the frame's start, so there it is
    g* o Pi_rec of the window, not the true rule)."""
    oracle = Oracle(vocab, library)
    return oracle if observer(learner).shows_active_frame else OnActiveFrame(oracle, vocab)

"""The active-frame map of Fig. 1(C): replay a token sequence with a stack; the model sees the top frame.

Three entry points over any token sequence:
- `active_frame(tokens)`: the paper's map Pi_rec, literally (total, idempotent);
- `check_prefix(tokens)`: why a sequence is not a legal trace prefix (or None);
- `cut_examples(tokens)`: the active-frame training examples (context, boundary m, depth, targets).

All three replay the sequence with `rlmlab.task.events.TraceReader`; `StackReplay` is that
reader keeping the examples it cuts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rlmlab.errors import TraceError
from rlmlab.task.events import ERROR, Frame, TraceReader


@dataclass(frozen=True)
class FrameExample:
    """One active-frame example: the model reads `context` and is trained on `targets`."""

    depth: int
    context: tuple[str, ...]
    targets: tuple[str, ...]

    @property
    def m(self) -> int:
        """Boundary: the number of visible-context tokens (no loss on them)."""
        return len(self.context)

    @property
    def width(self) -> int:
        return len(self.context) + len(self.targets)

    @property
    def tokens(self) -> tuple[str, ...]:
        return self.context + self.targets


def active_frame(tokens: Iterable[str]) -> list[str]:
    """Pi_rec exactly as Fig. 1(C) writes it: total on any sequence, returns the top frame."""
    r = TraceReader(legal=False)
    r.feed_all(tokens)
    return r.top


class StackReplay(TraceReader):
    """The legal-mode reader that also keeps the examples it cuts (`examples`, in cut order).

    On a legal sequence it agrees with `active_frame`; on an illegal one it records the first
    reason in `error` and stops changing.
    """

    def __init__(self, prompt: Sequence[str] = ()):
        self.examples: list[FrameExample] = []
        super().__init__(prompt)

    def cut(self, frame: Frame, depth: int) -> None:
        toks = frame.tokens
        self.examples.append(FrameExample(depth, tuple(toks[:frame.seg_start]), tuple(toks[frame.seg_start:])))

    def pending_example(self) -> FrameExample | None:
        """The segment in progress (for prefixes that stop mid-segment)."""
        if self.done or self.error is not None:
            return None
        f = self.stack[-1]
        if len(f.tokens) == f.seg_start:
            return None
        return FrameExample(self.depth, tuple(f.tokens[:f.seg_start]), tuple(f.tokens[f.seg_start:]))


def check_prefix(tokens: Iterable[str]) -> str | None:
    """None if `tokens` is a legal prefix of a call/return trace, else the reason it is not."""
    r = TraceReader()
    for t in tokens:
        if r.feed(t) == ERROR:
            return r.error
    return None


def cut_examples(tokens: Sequence[str], prompt_len: int) -> list[FrameExample]:
    """Cut a trace (written expression of `prompt_len` tokens, then the generated tokens)
    into its active-frame examples: one per push, one per pop, one at the end. An illegal
    sequence raises TraceError."""
    r = StackReplay(tokens[:prompt_len])
    for i in range(prompt_len, len(tokens)):
        if r.feed(tokens[i]) == ERROR:
            raise TraceError(r.error, i)
    pending = r.pending_example()
    return r.examples + ([pending] if pending else [])

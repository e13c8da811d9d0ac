"""The active-frame map of Fig. 1(C): replay a token sequence with a stack; the model sees the top frame.

Three entry points over any token sequence:
- `active_frame(tokens)`: the paper's map Pi_rec, literally (total, idempotent);
- `check_prefix(tokens)`: why a sequence is not a legal trace prefix (or None);
- `cut_examples(tokens)`: the active-frame training examples (context, boundary m, depth, targets).

`StackReplay` is the incremental form shared by all three and by the RM driver.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rlmlab.task.vocab import CALL, CONTROL, END_CALL, END_RETURN, RETURN, SPECIALS


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
    stack: list[list[str]] = [[]]
    for tok in tokens:
        top = stack[-1]
        top.append(tok)
        if tok == END_CALL:
            q = _ordinary_block(top, CALL)
            if q is not None:
                del top[len(top) - len(q) - 2:]
                stack.append(q)
        elif tok == END_RETURN and len(stack) >= 2:
            a = _ordinary_block(top, RETURN)
            if a is not None:
                stack.pop()
                stack[-1].extend(a)
    return stack[-1]


def _ordinary_block(top: list[str], opener: str) -> list[str] | None:
    """If `top` ends with `opener q closer` and q has no control token, return q."""
    for i in range(len(top) - 2, -1, -1):
        t = top[i]
        if t == opener:
            return top[i + 1:-1]
        if t in CONTROL:
            return None
    return None


@dataclass
class _Frame:
    tokens: list[str]
    seg_start: int
    opens: list[int] = field(default_factory=list)  # positions of unclosed <call>/<return>


class StackReplay:
    """Feeds tokens one at a time, keeping the frame stack, the examples cut so far and legality.

    On a legal sequence it agrees with `active_frame`; on an illegal one it records the first
    reason in `error` and stops changing.
    """

    def __init__(self, prompt: Sequence[str] = ()):
        self.stack: list[_Frame] = [_Frame([], 0)]
        self.examples: list[FrameExample] = []
        self.error: str | None = None
        self.done = False  # the root's return block has closed
        self.answer: list[str] | None = None  # the root's returned payload, once done
        self.max_depth = 1
        self.n_tokens = 0
        for t in prompt:
            self.feed(t)
        self.stack[0].seg_start = len(self.stack[0].tokens)

    @property
    def depth(self) -> int:
        return len(self.stack)

    @property
    def top(self) -> list[str]:
        return self.stack[-1].tokens

    def feed(self, tok: str) -> str | None:
        """Append one token. Returns "push", "pop", "done", "error" or None."""
        if self.error is not None:
            return "error"
        if self.done:
            return self._fail("token after the root returned")
        if tok in SPECIALS:
            return self._fail(f"model-level token {tok} inside a trace")
        self.n_tokens += 1
        frame = self.stack[-1]
        toks, opens = frame.tokens, frame.opens
        open_kind = toks[opens[-1]] if opens else None
        if tok == CALL:
            if open_kind == CALL:
                return self._fail("<call> inside a call payload")
            opens.append(len(toks))
            toks.append(tok)
        elif tok == RETURN:
            if open_kind is not None:
                return self._fail(f"<return> inside an open {open_kind} block")
            opens.append(len(toks))
            toks.append(tok)
        elif tok == END_CALL:
            if open_kind != CALL:
                return self._fail("</call> with no open <call>")
            start = opens.pop()
            q = toks[start + 1:]
            if not q:
                return self._fail("empty call payload")
            toks.append(tok)
            self.examples.append(FrameExample(self.depth, tuple(toks[:frame.seg_start]),
                                              tuple(toks[frame.seg_start:])))
            del toks[start:]
            self.stack.append(_Frame(q, len(q)))
            self.max_depth = max(self.max_depth, self.depth)
            return "push"
        elif tok == END_RETURN:
            if open_kind != RETURN:
                return self._fail("</return> with no open <return>")
            start = opens.pop()
            a = toks[start + 1:]
            if not a:
                return self._fail("empty return payload")
            toks.append(tok)
            if self.depth == 1:
                self.done = True
                self.answer = a
                self.examples.append(FrameExample(1, tuple(toks[:frame.seg_start]),
                                                  tuple(toks[frame.seg_start:])))
                return "done"
            self.examples.append(FrameExample(self.depth, tuple(toks[:frame.seg_start]),
                                              tuple(toks[frame.seg_start:])))
            self.stack.pop()
            parent = self.stack[-1]
            parent.tokens.extend(a)
            parent.seg_start = len(parent.tokens)
            return "pop"
        else:
            toks.append(tok)
        return None

    def _fail(self, reason: str) -> str:
        self.error = reason
        return "error"

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
    r = StackReplay()
    for t in tokens:
        if r.feed(t) == "error":
            return r.error
    return None


def cut_examples(tokens: Sequence[str], prompt_len: int) -> list[FrameExample]:
    """Cut a trace (written expression of `prompt_len` tokens, then the generated tokens)
    into its active-frame examples: one per push, one per pop, one at the end."""
    r = StackReplay(tokens[:prompt_len])
    for t in tokens[prompt_len:]:
        if r.feed(t) == "error":
            raise ValueError(f"not a legal trace: {r.error}")
    pending = r.pending_example()
    return r.examples + ([pending] if pending else [])

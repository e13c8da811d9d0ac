"""The call/return trace grammar, written once (spec: docs/trace-format.md).

Writing: the tokens of each step a frame takes (`literal_binding`, `binding_head`,
`call_block`, `literal_return`, `RETURN_HEAD`, `RETURN_CLOSE`). The executor writes with them,
and `trace_stats` counts with their lengths, so the count cannot drift from what is written.

Reading: `TraceReader` replays any token sequence, one token at a time, with a stack of frames
(Fig. 1(C)): on `</call>` the block's payload becomes a new frame (PUSH), on `</return>` with a
parent below the frame is popped and its payload appended to the parent (POP), and the root's
own `</return>` ends the trace (DONE). The replay's one rule, whichever mode: a closer acts
only when the frame's last control token is its own opener. With `legal=True` (decoders,
training examples) the reader also stops at the first token that no legal trace prefix has
and says why (ERROR); with `legal=False` it is the paper's total map Pi_rec, defined on any
sequence, which the `rm` and `reduce` observations need on whatever a window or a model shows.

`rlmlab.task.event_stream` gives the same replay as typed events with their token spans, for
the analyses that read a trace step by step (the probe, the shortcut checks).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlmlab.task.vocab import ASSIGN, CALL, CONTROL, END_CALL, END_RETURN, RETURN, RETURN_KW, SPECIALS

# --- writing --------------------------------------------------------------------------------


def literal_binding(name: str, value: str) -> list[str]:
    """`name := value`, a literal argument bound in place."""
    return [name, ASSIGN, value]


def binding_head(name: str) -> list[str]:
    """`name :=`, followed by the call block of an argument that is a call."""
    return [name, ASSIGN]


def call_block(call: Sequence[str]) -> list[str]:
    """`<call> call </call>`: a child frame evaluates the written call."""
    return [CALL, *call, END_CALL]


def literal_return(value: str) -> list[str]:
    """`return <return> value </return>`: a frame returns a literal."""
    return [RETURN_KW, RETURN, value, END_RETURN]


RETURN_HEAD = (RETURN_KW, RETURN)
"""Opens a return whose payload is a call block; `RETURN_CLOSE` follows once the child returned."""
RETURN_CLOSE = (END_RETURN,)

# The step lengths, for counting a trace without writing it.
LITERAL_BINDING_LEN = len(literal_binding("p", "0"))
BINDING_HEAD_LEN = len(binding_head("p"))
CALL_BLOCK_EXTRA = len(call_block(()))
LITERAL_RETURN_LEN = len(literal_return("0"))
RETURN_HEAD_LEN = len(RETURN_HEAD)
RETURN_CLOSE_LEN = len(RETURN_CLOSE)
VALUE_LEN = 1  # a value is one literal token


# --- reading: the replay --------------------------------------------------------------------

PUSH, POP, DONE, ERROR = "push", "pop", "done", "error"

_CONTROL = frozenset(CONTROL)
_LEGAL_WATCH = _CONTROL | frozenset(SPECIALS)  # the tokens the legal mode has to look at


class _Every:
    """Watches every token: a stopped legal reader answers each with ERROR."""

    def __contains__(self, tok) -> bool:
        return True


class Frame:
    """One frame of the replay: its tokens as the model sees them."""

    __slots__ = ("tokens", "seg_start", "controls")

    def __init__(self, tokens: list[str], seg_start: int):
        self.tokens = tokens
        self.seg_start = seg_start  # where the segment in progress began (see `frames.cut_examples`)
        # Positions of the control tokens in `tokens`; in a legal frame, the unclosed openers.
        self.controls: list[int] = []


class TraceReader:
    """A token sequence replayed with a stack of frames; `feed` returns PUSH, POP, DONE, ERROR or None.

    After PUSH, `top` is the new frame (its written call); after POP or DONE, `value` is the
    payload the frame returned (after DONE also `answer`). In the legal mode the first illegal
    token sets `error`, and it and every later token return ERROR; outside it nothing is illegal,
    and the root's `</return>` is an ordinary token (Pi_rec has no end).
    """

    def __init__(self, prompt: Iterable[str] = (), legal: bool = True):
        self.legal = legal
        self.stack: list[Frame] = [Frame([], 0)]
        self.error: str | None = None
        self.done = False  # the root's return block has closed
        self.answer: list[str] | None = None  # the root's returned payload, once done
        self.value: list[str] | None = None  # the payload of the last pop or of the root's return
        self.max_depth = 1
        self.n_cuts = 0  # active-frame examples cut: one per push, per pop and at the end
        # Most tokens are neither control nor special: `feed` appends those to the top frame
        # with one set lookup (it is called once per token by every decoder and packer).
        self._watch = _LEGAL_WATCH if legal else _CONTROL
        self._top = self.stack[0].tokens
        self.feed_all(prompt)
        self.stack[0].seg_start = len(self.stack[0].tokens)

    @property
    def depth(self) -> int:
        return len(self.stack)

    @property
    def top(self) -> list[str]:
        return self._top

    def cut(self, frame: Frame, depth: int) -> None:
        """Called when `frame` (at `depth`) ends a segment, before the stack changes; a
        subclass keeps the example (`frames.StackReplay`)."""

    def feed(self, tok: str) -> str | None:
        if tok not in self._watch:
            self._top.append(tok)
            return None
        return self._control(tok)

    def feed_all(self, tokens: Iterable[str]) -> None:
        """`feed` every token, dropping the events (Pi_rec of a whole sequence in one call)."""
        for tok in tokens:
            if tok in self._watch:
                self._control(tok)
            else:
                self._top.append(tok)

    def _control(self, tok: str) -> str | None:
        if self.error is not None:
            return ERROR
        legal = self.legal
        if legal:
            if self.done:
                return self._fail("token after the root returned")
            if tok not in _CONTROL:
                return self._fail(f"model-level token {tok} inside a trace")
        frame = self.stack[-1]
        toks, controls = frame.tokens, frame.controls
        opener = toks[controls[-1]] if controls else None
        if legal:
            why = _illegal(tok, opener, len(toks) - controls[-1] - 1 if controls else 0)
            if why is not None:
                return self._fail(why)
        if tok == END_CALL and opener == CALL:
            start = controls.pop()
            q = toks[start + 1:]
            toks.append(tok)
            self.cut(frame, len(self.stack))
            self.n_cuts += 1
            del toks[start:]
            self.stack.append(Frame(q, len(q)))
            self._top = q
            if len(self.stack) > self.max_depth:
                self.max_depth = len(self.stack)
            return PUSH
        if tok == END_RETURN and opener == RETURN and (legal or len(self.stack) >= 2):
            start = controls.pop()
            a = toks[start + 1:]
            toks.append(tok)
            self.cut(frame, len(self.stack))
            self.n_cuts += 1
            self.value = a
            if len(self.stack) == 1:
                self.done = True
                self.answer = a
                self._watch = _Every()
                return DONE
            self.stack.pop()
            parent = self.stack[-1]
            parent.tokens.extend(a)
            parent.seg_start = len(parent.tokens)
            self._top = parent.tokens
            return POP
        # An opener, or (outside the legal mode) a closer that closes nothing: an ordinary token
        # of the frame that later closers see as the nearest control token.
        controls.append(len(toks))
        toks.append(tok)
        return None

    def _fail(self, reason: str) -> str:
        self.error = reason
        self._watch = _Every()
        return ERROR


def _illegal(tok: str, opener: str | None, payload_len: int) -> str | None:
    """Why control token `tok` cannot come next in a legal trace whose frame's innermost open
    block was opened by `opener` (None: no open block) and holds `payload_len` tokens."""
    if tok == CALL:
        return "<call> inside a call payload" if opener == CALL else None
    if tok == RETURN:
        return f"<return> inside an open {opener} block" if opener is not None else None
    if tok == END_CALL:
        if opener != CALL:
            return "</call> with no open <call>"
        return "empty call payload" if payload_len == 0 else None
    if opener != RETURN:
        return "</return> with no open <return>"
    return "empty return payload" if payload_len == 0 else None

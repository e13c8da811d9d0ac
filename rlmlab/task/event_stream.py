"""The trace as typed events (spec: docs/trace-format.md, "Reading a trace as events").

`events(tokens, prompt_len)` is `TraceReader`'s replay with token spans: `Push` (a frame opens
on a written call), `Bind` (`name := value`), `Return` (a frame's `return <return> ...
</return>`) and `Pop` (a frame hands its value back); `write(events)` writes the tokens back.
`frame_steps` reads the `Bind` and `Return` steps off one frame as the model sees it. The
invariance probe and the shortcut constructions read traces this way; training and decoding
need only the replay itself (`rlmlab.task.events`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from rlmlab.errors import TraceError
from rlmlab.task.events import (
    DONE,
    ERROR,
    LITERAL_BINDING_LEN,
    POP,
    PUSH,
    RETURN_CLOSE,
    RETURN_CLOSE_LEN,
    RETURN_HEAD,
    RETURN_HEAD_LEN,
    TraceReader,
    binding_head,
    call_block,
    literal_binding,
)
from rlmlab.task.vocab import ASSIGN, CONTROL, END_RETURN, RETURN_KW, SPECIALS

_CONTROL = frozenset(CONTROL)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Span:
    """An event of frame `depth` (the root: 1) over the trace's tokens `[start, end)`."""

    depth: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Push(_Span):
    """A frame opens and evaluates the written call `call`. Its tokens are the written
    expression (the root) or the parent's `<call> call </call>`."""

    call: tuple[str, ...]

    @property
    def fn(self) -> str:
        return self.call[0]

    @property
    def args(self) -> tuple[tuple[str, ...], ...]:
        """The written arguments, split at the call's own commas."""
        out, cur, level = [], [], 0
        for t in self.call[2:-1]:
            if t == "," and level == 0:
                out.append(tuple(cur))
                cur = []
                continue
            level += (t == "(") - (t == ")")
            cur.append(t)
        if cur:
            out.append(tuple(cur))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class Bind(_Span):
    """The frame binds `name := value`. Its tokens run from the name through the literal, or, for
    an argument that is a call, through the child's closing `</return>` (the flattened trace
    never writes that value; the frame does)."""

    name: str
    value: str

    @property
    def literal(self) -> bool:
        return self.end - self.start == LITERAL_BINDING_LEN


@dataclass(frozen=True, slots=True)
class Return(_Span):
    """The frame returns `value`: its tokens are `return <return> ... </return>`, the child's
    whole trace included when the payload was a call block."""

    value: tuple[str, ...]

    @property
    def literal(self) -> bool:
        return self.end - self.start == RETURN_HEAD_LEN + len(self.value) + RETURN_CLOSE_LEN


@dataclass(frozen=True, slots=True)
class Pop:
    """Frame `depth` is done and hands `value` to the frame below (none below the root: the trace
    is complete). It happens at the `</return>` ending at `end`, right after that frame's `Return`."""

    depth: int
    value: tuple[str, ...]
    end: int


Event = Push | Bind | Return | Pop


def events(tokens: Sequence[str], prompt_len: int, errors: str = "raise") -> Iterator[Event]:
    """The events of a trace or of a prefix of one, in token order (a `Push` for the written
    expression first). A token no legal trace prefix has raises `TraceError`, or with
    `errors="stop"` ends the stream there (model output: what came before still counts).

    A `Bind` or `Return` is reported when the frame's tokens have the grammar's form; a
    sequence whose control tokens are legal but whose steps are not (only a model writes one)
    gives its pushes and pops and fewer steps."""
    if errors not in ("raise", "stop"):
        raise ValueError(f"errors must be 'raise' or 'stop', got {errors!r}")
    bad = next((i for i in range(prompt_len) if tokens[i] in CONTROL or tokens[i] in SPECIALS), None)
    if bad is not None:
        if errors == "raise":
            raise TraceError(f"{tokens[bad]} in the written expression", bad)
        return
    r = TraceReader(tokens[:prompt_len])
    yield Push(tuple(tokens[:prompt_len]), depth=1, start=0, end=prompt_len)
    feed, stack = r.feed, r.stack
    # Per frame, the trace position of each of its tokens but a closer just fed; a value a
    # child returned stands at the child's closing `</return>`.
    where: list[list[int]] = [list(range(prompt_len))]
    pos = where[-1]
    for i in range(prompt_len, len(tokens)):
        frame = stack[-1]
        ev = feed(tokens[i])
        if ev is None:
            pos.append(i)
            toks = frame.tokens
            # `toks[-2] == ASSIGN` first: it rules out nearly every token at once.
            if len(toks) >= LITERAL_BINDING_LEN and toks[-2] == ASSIGN and not frame.controls \
                    and _binding(toks, len(toks) - LITERAL_BINDING_LEN):
                yield Bind(toks[-3], toks[-1], depth=len(stack), start=pos[-3], end=i + 1)
        elif ev == ERROR:
            if errors == "raise":
                raise TraceError(r.error, i)
            return
        elif ev == PUSH:
            start = len(frame.tokens)  # where the <call> stood
            call_at = pos[start]
            del pos[start:]
            pos = list(range(call_at + 1, i))
            where.append(pos)
            yield Push(tuple(r.top), depth=len(stack), start=call_at, end=i + 1)
        else:
            value = tuple(r.value)
            depth = len(stack) + 1 if ev == POP else 1
            toks = frame.tokens  # it ends `<return> value </return>`
            ret = len(toks) - len(value) - 2
            head = ret - 1 if ret >= 1 and toks[ret - 1] == RETURN_KW else ret
            yield Return(value, depth=depth, start=pos[head], end=i + 1)
            yield Pop(depth, value, i + 1)
            if ev == DONE:
                if i + 1 < len(tokens) and errors == "raise":
                    raise TraceError("token after the root returned", i + 1)
                return
            where.pop()
            pos = where[-1]
            pos.extend([i] * len(value))
            toks = r.top
            if len(toks) >= LITERAL_BINDING_LEN and _binding(toks, len(toks) - LITERAL_BINDING_LEN):
                yield Bind(toks[-3], toks[-1], depth=len(stack), start=pos[-3], end=i + 1)


def _binding(frame: Sequence[str], k: int) -> bool:
    """Whether a frame's tokens k, k+1, k+2 are a step `name := value`."""
    return frame[k + 1] == ASSIGN and frame[k] not in _CONTROL and frame[k + 2] not in _CONTROL


def frame_steps(frame: Sequence[str], call_len: int, depth: int = 1) -> list[Bind | Return]:
    """The steps of one frame as the model sees it (its written call of `call_len` tokens, then
    what it wrote, each child's value in place of the child's call block): its bindings, then
    its return once it has written one. Spans are positions in `frame`."""
    out: list[Bind | Return] = []
    k = call_len
    while k + LITERAL_BINDING_LEN <= len(frame) and _binding(frame, k):
        out.append(Bind(frame[k], frame[k + 2], depth=depth, start=k, end=k + LITERAL_BINDING_LEN))
        k += LITERAL_BINDING_LEN
    head = k + RETURN_HEAD_LEN
    if len(frame) > head and tuple(frame[k:head]) == RETURN_HEAD and frame[-1] == END_RETURN:
        out.append(Return(tuple(frame[head:-1]), depth=depth, start=k, end=len(frame)))
    return out


def write(stream: Iterable[Event]) -> list[str]:
    """The tokens of a complete trace's events (the inverse of `events`): each event writes the
    tokens that are its own, at its own positions."""
    out: dict[int, str] = {}

    def put(at: int, toks: Sequence[str]) -> None:
        for k, t in enumerate(toks):
            out[at + k] = t

    for e in stream:
        if isinstance(e, Push):
            put(e.start, e.call if e.depth == 1 else call_block(e.call))
        elif isinstance(e, Bind):
            put(e.start, literal_binding(e.name, e.value) if e.literal else binding_head(e.name))
        elif isinstance(e, Return):
            put(e.start, RETURN_HEAD + e.value if e.literal else RETURN_HEAD)
            put(e.end - RETURN_CLOSE_LEN, RETURN_CLOSE)
    n = max(out) + 1 if out else 0
    holes = [i for i in range(n) if i not in out]
    if holes:
        raise TraceError("the events leave tokens unwritten", holes[0])
    return [out[i] for i in range(n)]

"""Reading an executed trace: its frames as a tree, a frame's internal returns, and the root
frame RM ends on (what the validity checks compare).

Positions are 0-based indices into the complete token sequence `Execution.tokens`: the written
expression first, then every emitted token. The internal returns of a frame are the values v of
the `<return> v </return>` blocks (v a digit) inside that frame's span of the trace, in trace
order; for a tail recursion the last one is the frame's own value (its base case returns a
literal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlmlab.errors import DataError
from rlmlab.task.events import (
    LITERAL_BINDING_LEN,
    RETURN_CLOSE_LEN,
    RETURN_HEAD_LEN,
    Bind,
    Pop,
    Push,
    Return,
    events,
)
from rlmlab.task.expr import DIGITS, Expr
from rlmlab.task.trace import Execution


# --- frames of the flattened trace ---------------------------------------------------

@dataclass(frozen=True)
class TraceFrame:
    """One frame of an executed trace, located in the flattened token sequence."""

    call: tuple[str, ...]
    """The written call the frame evaluates (the root: the whole expression)."""
    start: int
    """Index of the first token the frame emits (just after the `</call>` that opened it)."""
    end: int
    """Index one past the frame's closing `</return>`."""
    value: str
    """The value the frame returns."""
    children: tuple["TraceFrame", ...]
    """Frames it opened, in order: argument calls, then the body or branch call."""


def frame_tree(tokens: Sequence[str], prompt_len: int) -> TraceFrame:
    """The frames of a complete trace as a tree, from the trace's events: a frame opens at its
    push and closes at its pop, whose payload is its value."""
    stack: list[tuple[Push, list[TraceFrame]]] = []
    for e in events(tokens, prompt_len):  # an illegal trace raises TraceError, a DataError
        if type(e) is Push:
            stack.append((e, []))
        elif type(e) is Pop:
            push, children = stack.pop()
            frame = TraceFrame(push.call, push.end, e.end, e.value[-1], tuple(children))
            if not stack:
                if e.end != len(tokens):
                    raise DataError("trace continues after the root returned")
                return frame
            stack[-1][1].append(frame)
    raise DataError("incomplete trace: the root frame never returned")


def internal_returns(tokens: Sequence[str], frame: TraceFrame) -> list[tuple[int, int]]:
    """(position, value) of every integer literal return `<return> v </return>` inside `frame`.
    The frame's tokens are the trace of its own call run as a root, so they are read as one."""
    call = list(frame.call)
    shift = frame.start - len(call)
    return [(shift + e.end - 1 - RETURN_CLOSE_LEN, int(e.value[0]))
            for e in events(call + list(tokens[frame.start:frame.end]), len(call))
            if type(e) is Return and e.literal and e.value[0] in DIGITS]


def descendants(frame: TraceFrame):
    """Every frame below `frame`, in the order they open."""
    for c in frame.children:
        yield c
        yield from descendants(c)


def child(frame: TraceFrame, *path: int) -> TraceFrame:
    """Follow child indices down the frame tree."""
    for k in path:
        frame = frame.children[k]
    return frame


def answer_position(tokens: Sequence[str]) -> int:
    """Position of the final answer token: the trace ends `<return> a </return>`."""
    return len(tokens) - 2


# --- the RM root frame used by the validity checks -------------------------------

@dataclass(frozen=True)
class RootFrame:
    """What the validity checks need from one example: RM's final root frame and S."""

    fn: str
    """Root function."""
    payload: tuple[str, ...]
    """Bound value of each root parameter in order (literal or value returned by a child)."""
    answer: str
    """The root's answer."""
    answer_pos: int
    """Index of the answer token in RM's final root frame (context + targets)."""
    signal: str
    """S(x)."""
    literals: tuple[tuple[tuple[int, ...], str], ...]
    """(path of argument indices, token) for every literal leaf of the written expression."""


def root_payload(tokens: Sequence[str], prompt_len: int) -> tuple[tuple[str, ...], int]:
    """Bound values of the root frame (its `p := v` bindings, each child's value in place) and
    the index of its answer token in RM's final root frame (context + targets): the written
    expression, one literal binding per parameter, then `return <return> a </return>`."""
    payload = tuple(e.value for e in events(tokens, prompt_len) if type(e) is Bind and e.depth == 1)
    return payload, prompt_len + LITERAL_BINDING_LEN * len(payload) + RETURN_HEAD_LEN


def literal_paths(e: Expr, path: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], str]]:
    """(path of argument indices, token) of every literal leaf of the written expression `e`."""
    if isinstance(e, str):
        return [(path, e)]
    out = []
    for k, a in enumerate(e.args):
        out.extend(literal_paths(a, path + (k,)))
    return out


def root_frame(ex: Execution, signal: str) -> RootFrame:
    """The root frame of an executed example with its signal S."""
    payload, pos = root_payload(ex.tokens, ex.prompt_len)
    return RootFrame(ex.expr.fn, payload, ex.value_token, pos, signal, tuple(literal_paths(ex.expr)))

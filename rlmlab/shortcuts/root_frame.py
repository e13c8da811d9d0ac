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
from rlmlab.task.event_stream import Bind, Pop, Push, Return, events, frame_steps
from rlmlab.task.events import RETURN_CLOSE_LEN
from rlmlab.task.expr import DIGITS, Expr
from rlmlab.task.frames import FrameExample
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
    returned_at: int | None = None
    """Index of the value token if the frame returned a literal (`return <return> v </return>`);
    None if its value came back from a call."""


def frame_tree(tokens: Sequence[str], prompt_len: int) -> TraceFrame:
    """The frames of a complete trace as a tree, from the trace's events: a frame opens at its
    push and closes at its pop, whose payload is its value."""
    stack: list[tuple[Push, list[TraceFrame]]] = []
    literal_at = None
    for e in events(tokens, prompt_len):  # an illegal trace raises TraceError, a DataError
        if type(e) is Push:
            stack.append((e, []))
        elif type(e) is Return:
            literal_at = e.end - RETURN_CLOSE_LEN - 1 if e.literal else None
        elif type(e) is Pop:  # right after its frame's Return
            push, children = stack.pop()
            frame = TraceFrame(push.call, push.end, e.end, e.value[-1], tuple(children), literal_at)
            if not stack:
                if e.end != len(tokens):
                    raise DataError("trace continues after the root returned")
                return frame
            stack[-1][1].append(frame)
    raise DataError("incomplete trace: the root frame never returned")


def internal_returns(tokens: Sequence[str], frame: TraceFrame) -> list[tuple[int, int]]:
    """(position, value) of every integer literal return `<return> v </return>` inside `frame`
    (its own and its descendants', as `frame_tree` read them; `tokens` is the same trace)."""
    return sorted((f.returned_at, int(f.value)) for f in (frame, *descendants(frame))
                  if f.returned_at is not None and f.value in DIGITS)


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


def root_payload(frames: Sequence[FrameExample], prompt_len: int) -> tuple[tuple[str, ...], int]:
    """Bound values of the root frame (its `p := v` steps after every child returned) and the
    local index of its answer token, read from RM's final root frame (the execution's last root
    example): the written expression, one binding per parameter, then `return <return> a </return>`."""
    last = [f for f in frames if f.depth == 1][-1].tokens
    steps = frame_steps(last, prompt_len)
    if not steps or type(steps[-1]) is not Return:
        raise DataError("the root frame has not returned")
    return tuple(s.value for s in steps if type(s) is Bind), steps[-1].end - RETURN_CLOSE_LEN - 1


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
    payload, pos = root_payload(ex.frames, ex.prompt_len)
    return RootFrame(ex.expr.fn, payload, ex.value_token, pos, signal, tuple(literal_paths(ex.expr)))

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
from rlmlab.task.expr import DIGITS, Expr
from rlmlab.task.frames import FrameExample, StackReplay
from rlmlab.task.trace import Execution
from rlmlab.task.vocab import ASSIGN, END_RETURN, RETURN


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
    """The frames of a complete trace as a tree, read off the stack replay that cuts RM's
    examples (`StackReplay`): a frame opens at its push and closes at its `</return>`, whose
    payload is its value."""
    replay = StackReplay(tokens[:prompt_len])
    stack: list[dict] = [{"call": tuple(tokens[:prompt_len]), "start": prompt_len, "children": []}]
    for i in range(prompt_len, len(tokens)):
        event = replay.feed(tokens[i])
        if event == "error":
            raise DataError(f"not a legal trace at token {i}: {replay.error}")
        if event == "push":
            stack.append({"call": tuple(replay.top), "start": i + 1, "children": []})
        elif event in ("pop", "done"):
            returned = replay.answer if event == "done" else replay.top[-1:]
            b = stack.pop()
            frame = TraceFrame(b["call"], b["start"], i + 1, returned[-1], tuple(b["children"]))
            if event == "done":
                if i != len(tokens) - 1:
                    raise DataError("trace continues after the root returned")
                return frame
            stack[-1]["children"].append(frame)
    raise DataError("incomplete trace: the root frame never returned")


def internal_returns(tokens: Sequence[str], frame: TraceFrame) -> list[tuple[int, int]]:
    """(position, value) of every integer literal return `<return> v </return>` inside `frame`."""
    out = []
    for i in range(frame.start + 1, frame.end - 1):
        if tokens[i - 1] == RETURN and tokens[i + 1] == END_RETURN and tokens[i] in DIGITS:
            out.append((i, int(tokens[i])))
    return out


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
    """Bound values of the root frame (its `p := v` pairs after every child returned) and the
    local index of its answer token, from the execution's last root example."""
    last = [f for f in frames if f.depth == 1][-1]
    toks = last.tokens
    payload, i = [], prompt_len
    while i + 2 < len(toks) and toks[i + 1] == ASSIGN:
        payload.append(toks[i + 2])
        i += 3
    return tuple(payload), len(toks) - 2


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

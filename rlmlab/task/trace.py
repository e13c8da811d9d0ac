"""The executor: an expression becomes its canonical call/return trace (spec: docs/trace-format.md).

`execute` writes the flattened trace with the step templates of `rlmlab.task.events` and,
independently of the replay in `frames`, the active-frame examples each frame produces; tests
check that the two agree. `trace_stats` computes the statistics the experiments split on
without writing any token, counting with the same templates' lengths, memoised per sub-call,
for building large pools quickly.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import lru_cache

from rlmlab.errors import ExprError
from rlmlab.task.events import (
    BINDING_HEAD_LEN,
    CALL_BLOCK_EXTRA,
    LITERAL_BINDING_LEN,
    LITERAL_RETURN_LEN,
    RETURN_CLOSE,
    RETURN_CLOSE_LEN,
    RETURN_HEAD,
    RETURN_HEAD_LEN,
    VALUE_LEN,
    binding_head,
    call_block,
    literal_binding,
    literal_return,
)
from rlmlab.task.expr import (
    Call,
    Expr,
    literal_value,
    parse,
    size,
    substitute,
    to_text,
    value_token,
)
from rlmlab.task.expr import tokens as expr_tokens
from rlmlab.task.frames import FrameExample
from rlmlab.task.library import Library
from rlmlab.task.rules import Lazy


@dataclass(frozen=True)
class Execution:
    """An evaluated expression: its trace, value, frames and the statistics experiments split on."""

    expr: Call
    value: int | bool
    tokens: tuple[str, ...]  # written expression, then every emitted token
    prompt_len: int  # tokens of the written expression
    frames: tuple[FrameExample, ...]
    max_depth: int

    @property
    def text(self) -> str:
        return to_text(self.expr)

    @property
    def value_token(self) -> str:
        return value_token(self.value)

    @property
    def trace_len(self) -> int:
        return len(self.tokens)

    @property
    def max_frame_width(self) -> int:
        return max(f.width for f in self.frames)

    @property
    def n_frame_examples(self) -> int:
        return len(self.frames)


class _Run:
    def __init__(self, library: Library):
        self.library = library
        self.out: list[str] = []
        self.frames: list[FrameExample] = []
        self.max_depth = 0

    def frame(self, q: Call, q_toks: list[str], depth: int) -> int | bool:
        """Evaluate the call `q` in its own frame, emitting its tokens; returns its value."""
        self.max_depth = max(self.max_depth, depth)
        fn = self.library[q.fn]
        frame = list(q_toks)
        seg = [len(frame)]  # start of the current segment in `frame`

        def emit(toks: list[str]) -> None:
            frame.extend(toks)
            self.out.extend(toks)

        def call(e: Call, prefix: list[str]) -> str:
            """Emit `prefix <call> e </call>`, run the child, and write its value into this frame."""
            e_toks = expr_tokens(e)
            block = call_block(e_toks)
            emit(prefix + block)
            self.frames.append(FrameExample(depth, tuple(frame[:seg[0]]), tuple(frame[seg[0]:])))
            v = value_token(self.frame(e, e_toks, depth + 1))
            del frame[len(frame) - len(block):]
            frame.append(v)
            seg[0] = len(frame)
            return v

        bound: list[str] = []
        for p, arg in zip(fn.params, q.args):
            if isinstance(arg, str):
                emit(literal_binding(p, arg))
                bound.append(arg)
            else:
                bound.append(call(arg, binding_head(p)))

        if fn.impl is not None:
            v = fn.impl(*map(literal_value, bound))
            body: Expr = q.args[v.index] if type(v) is Lazy else value_token(v)  # a lazy argument: a tail call
        else:
            body = substitute(self.library.bodies[fn.name], dict(zip(fn.params, bound)))

        if isinstance(body, str):
            emit(literal_return(body))
            value = body
        else:
            value = call(body, list(RETURN_HEAD))
            emit(list(RETURN_CLOSE))
        self.frames.append(FrameExample(depth, tuple(frame[:seg[0]]), tuple(frame[seg[0]:])))
        return literal_value(value)


def execute(expr: Expr | str, library: Library) -> Execution:
    """Run an expression (a `Call` or its written form) and return its canonical trace."""
    if isinstance(expr, str):
        expr = parse(expr, library)
    if not isinstance(expr, Call):
        raise ExprError(f"{expr!r} is a literal; a trace starts from a call")
    run = _Run(library)
    prompt = expr_tokens(expr)
    run.out.extend(prompt)
    value = run.frame(expr, prompt, 1)
    return Execution(expr, value, tuple(run.out), len(prompt), tuple(run.frames), run.max_depth)


@dataclass(frozen=True)
class TraceStats:
    """What a pool row records about an execution, computed without writing the trace."""

    value: int | bool
    trace_len: int
    max_depth: int
    max_frame_width: int
    n_frame_examples: int
    lane_tokens: int
    """Tokens of RM's lane-packed examples (`rlmlab.learning.lanes`), over all frame instances:
    each frame's lane holds its call payload, everything it writes (its call blocks included) and
    one returned value per child it calls."""
    n_frame_instances: int
    """Calls executed (one lane each)."""
    longest_lane: int
    """Tokens of the longest single lane."""


def trace_stats(expr: Call, library: Library) -> TraceStats:
    value, emitted, depth, width, n, lanes, frames, longest = _stats_fn(library)(expr)
    return TraceStats(value, size(expr) + emitted, depth, width, n, lanes, frames, longest)


_STATS_CACHE: "weakref.WeakKeyDictionary[Library, object]" = weakref.WeakKeyDictionary()


def _stats_fn(library: Library):
    """A memoised `frame stats` for one library: every sub-call's stats depend on that call alone."""
    if library in _STATS_CACHE:
        return _STATS_CACHE[library]

    fns = library.functions
    bodies = library.bodies
    # The steps' token counts, from the templates the executor writes with (closure constants:
    # no global lookup in the memoised recursion).
    bind_literal, bind_head, block, return_literal = (LITERAL_BINDING_LEN, BINDING_HEAD_LEN, CALL_BLOCK_EXTRA,
                                                      LITERAL_RETURN_LEN)
    return_head, return_close, value_len = RETURN_HEAD_LEN, RETURN_CLOSE_LEN, VALUE_LEN

    @lru_cache(maxsize=1 << 20)
    def csize(e: Expr) -> int:
        """`size`, memoised per sub-expression: `stats` asks for the size of every frame and call
        block, which re-walks each subtree once per ancestor with the plain recursion."""
        if isinstance(e, str):
            return 1
        return 2 + len(e.args) + sum(csize(a) for a in e.args)

    @lru_cache(maxsize=1 << 20)
    def stats(q: Call) -> tuple[int | bool, int, int, int, int, int, int, int]:
        """(value, tokens this frame and its descendants emit, depth below incl. this frame,
        widest example, number of examples, lane tokens of this frame and its descendants,
        frame instances, longest lane)."""
        fn = fns[q.fn]
        ctx = csize(q)  # the frame's committed tokens
        seg = 0  # tokens generated in the current segment
        emitted = depth = n = 0
        width = 0
        lane = ctx  # the call payload opens the frame's lane
        lanes_below = frames_below = longest = 0
        bound = []

        def child(e: Call, prefix: int) -> int | bool:
            nonlocal ctx, seg, emitted, depth, n, width, lane, lanes_below, frames_below, longest
            esize = csize(e)
            seg += prefix + esize + block
            width = max(width, ctx + seg)
            n += 1
            v, c_emit, c_depth, c_width, c_n, c_lanes, c_frames, c_longest = stats(e)
            emitted += seg + c_emit
            depth = max(depth, c_depth)
            width = max(width, c_width)
            n += c_n
            lane += seg + value_len  # what the frame wrote up to the call block, and the value back
            lanes_below += c_lanes
            frames_below += c_frames
            longest = max(longest, c_longest)
            ctx += seg - esize - block + value_len  # the block gives way to the value
            seg = 0
            return v

        for p, arg in zip(fn.params, q.args):
            if isinstance(arg, str):
                seg += bind_literal
                bound.append(literal_value(arg))
            else:
                bound.append(child(arg, bind_head))
        if fn.impl is not None:
            v = fn.impl(*bound)
            body = q.args[v.index] if type(v) is Lazy else value_token(v)
        else:
            body = substitute(bodies[fn.name], dict(zip(fn.params, map(value_token, bound))))
        if isinstance(body, str):
            value = literal_value(body)
            seg += return_literal
        else:
            value = child(body, return_head)
            seg += return_close
        emitted += seg
        width = max(width, ctx + seg)
        lane += seg
        return value, emitted, depth + 1, width, n + 1, lane + lanes_below, frames_below + 1, max(longest, lane)

    _STATS_CACHE[library] = stats
    return stats

"""The trace's one reader (`rlmlab.task.events`; its typed events in `rlmlab.task.event_stream`):
its events write the trace back, agree with the executor, and every reader built on it gives
what the readers it replaced gave (their code, small enough to keep, is copied below as the
reference)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmlab.errors import DataError, TraceError
from rlmlab.learning.observe import _collapses
from rlmlab.measuring.probe import completed_calls
from rlmlab.shortcuts.root_frame import descendants, frame_tree, internal_returns, root_payload
from rlmlab.task.event_stream import Bind, Pop, Push, Return, events, frame_steps, write
from rlmlab.task.events import DONE, ERROR, POP, PUSH, TraceReader
from rlmlab.task.expr import DIGITS, tokens
from rlmlab.task.frames import StackReplay, active_frame
from rlmlab.task.sampler import ExpressionSampler
from rlmlab.task.taskfile import load_task
from rlmlab.task.vocab import ASSIGN, CALL, CONTROL, END_CALL, END_RETURN, RETURN, SPECIALS

PAPER = load_task("paper")

SAMPLER = ExpressionSampler(library=PAPER.library)
_ALPHABET = list(CONTROL) + list(SPECIALS) + ["add", "(", ")", "2", "x", ":=", "return"]


def sampled(seed: int):
    return PAPER.execute(SAMPLER.sample(random.Random(seed)))


def corrupted(ex, rng: random.Random) -> list[str]:
    """A trace with a few tokens replaced, dropped or inserted after its written expression,
    as a model would get it wrong."""
    t = list(ex.tokens)
    for _ in range(rng.randint(1, 3)):
        k = rng.randrange(ex.prompt_len, len(t))
        op = rng.random()
        if op < 0.4:
            t[k] = rng.choice(_ALPHABET + ["3", "y", "square"])
        elif op < 0.7:
            del t[k]
        else:
            t.insert(k, rng.choice(CONTROL))
    return t


# --- the replaced readers, as they were -------------------------------------------------


def old_active_frame(tokens):
    stack = [[]]
    for tok in tokens:
        top = stack[-1]
        top.append(tok)
        if tok == END_CALL:
            q = old_ordinary_block(top, CALL)
            if q is not None:
                del top[len(top) - len(q) - 2:]
                stack.append(q)
        elif tok == END_RETURN and len(stack) >= 2:
            a = old_ordinary_block(top, RETURN)
            if a is not None:
                stack.pop()
                stack[-1].extend(a)
    return stack[-1]


def old_ordinary_block(top, opener):
    for i in range(len(top) - 2, -1, -1):
        if top[i] == opener:
            return top[i + 1:-1]
        if top[i] in CONTROL:
            return None
    return None


def old_ordinary_tail(seq, start, opener):
    for i in range(len(seq) - 2, start - 1, -1):
        if seq[i] == opener:
            return i
        if seq[i] in CONTROL:
            return None
    return None


def old_reduction_steps(tokens):
    out, opens = [], []
    for tok in tokens:
        out.append(tok)
        start = opens[-1][1] if opens else 0
        before = None
        if tok == END_CALL:
            i = old_ordinary_tail(out, start, CALL)
            if i is not None:
                opens.append((i, len(out)))
        elif tok == END_RETURN and opens:
            i = old_ordinary_tail(out, start, RETURN)
            if i is not None:
                before = tuple(out)
                a = out[i + 1:-1]
                del out[opens.pop()[0]:]
                out.extend(a)
        yield list(out), before


def old_completed_calls(tokens, prompt_len):
    r = StackReplay(tokens[:prompt_len])
    payloads, out = [], []
    for i in range(prompt_len, len(tokens)):
        frame = list(r.top) if tokens[i] == END_RETURN else None
        n_frame = len(frame) if frame is not None else 0
        event = r.feed(tokens[i])
        if event == "push":
            payloads.append(list(r.top))
        elif event == "pop":
            j = n_frame - 1
            while frame[j] != RETURN:
                j -= 1
            out.append((" ".join(payloads.pop()), " ".join(frame[j + 1:n_frame]), r.depth + 1))
        elif event in ("error", "done"):
            break
    return out


def old_root_payload(ex):
    toks = [f for f in ex.frames if f.depth == 1][-1].tokens
    payload, i = [], ex.prompt_len
    while i + 2 < len(toks) and toks[i + 1] == ASSIGN:
        payload.append(toks[i + 2])
        i += 3
    return tuple(payload), len(toks) - 2


def old_internal_returns(tokens, frame):
    return [(i, int(tokens[i])) for i in range(frame.start + 1, frame.end - 1)
            if tokens[i - 1] == RETURN and tokens[i + 1] == END_RETURN and tokens[i] in DIGITS]


def old_recursions(tokens, frame):
    fn = frame.call[0]
    return sum(1 for i in range(frame.start, frame.end - 1) if tokens[i] == CALL and tokens[i + 1] == fn)


# --- the events -------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_events_write_the_trace_back(seed):
    ex = sampled(seed)
    assert write(events(ex.tokens, ex.prompt_len)) == list(ex.tokens)


def test_events_agree_with_the_executor(random_exprs):
    for e in random_exprs:
        ex = PAPER.execute(e)
        evs = list(events(ex.tokens, ex.prompt_len))
        assert write(evs) == list(ex.tokens)
        pushes = [p for p in evs if type(p) is Push]
        # one push per frame instance, the executor's frames being 2F - 1 examples
        assert 2 * len(pushes) - 1 == len(ex.frames)
        assert pushes[0] == Push(tuple(tokens(e)), depth=1, start=0, end=ex.prompt_len)
        for p in pushes[1:]:
            assert ex.tokens[p.start:p.end] == (CALL, *p.call, END_CALL)
            assert p.fn == p.call[0] and " , ".join(" ".join(a) for a in p.args) == " ".join(p.call[2:-1])
        pops = [p for p in evs if type(p) is Pop]
        assert len(pops) == len(pushes) and pops[-1] == Pop(1, (ex.value_token,), ex.trace_len)
        assert max(p.depth for p in pushes) == ex.max_depth
        for b in (b for b in evs if type(b) is Bind):
            assert ex.tokens[b.start:b.start + 2] == (b.name, ASSIGN)
            assert ex.tokens[b.end - 1] == (b.value if b.literal else END_RETURN)
        for r in (r for r in evs if type(r) is Return):
            assert ex.tokens[r.start] == "return" and ex.tokens[r.end - 1] == END_RETURN
        # the root's steps as the trace gives them and as its final frame (what RM reads) does
        final = [f for f in ex.frames if f.depth == 1][-1].tokens
        assert [(type(x), x.value) for x in evs if type(x) in (Bind, Return) and x.depth == 1] == \
               [(type(x), x.value) for x in frame_steps(final, ex.prompt_len)]
        for a, b in zip(evs, evs[1:]):
            if type(a) is Return:  # followed by the Pop of its frame
                assert type(b) is Pop and (b.depth, b.value, b.end) == (a.depth, a.value, a.end)


def test_a_prefix_gives_the_events_completed_in_it(random_exprs):
    for e in random_exprs[:80]:
        ex = PAPER.execute(e)
        full = list(events(ex.tokens, ex.prompt_len))
        for n in range(ex.prompt_len, ex.trace_len, 7):
            part = list(events(ex.tokens[:n], ex.prompt_len))
            assert part == full[:len(part)]
            assert all(getattr(x, "end", 0) <= n for x in part)


def test_an_illegal_trace_raises_or_stops_where_it_goes_wrong():
    ex = PAPER.execute("add(square(2),3)")
    bad = list(ex.tokens)
    k = bad.index(END_CALL)
    bad[k] = RETURN
    with pytest.raises(TraceError, match=f"at token {k}: <return> inside an open <call> block") as err:
        list(events(bad, ex.prompt_len))
    assert isinstance(err.value, DataError) and isinstance(err.value, ValueError) and err.value.pos == k
    root = Push(tuple(ex.tokens[:ex.prompt_len]), depth=1, start=0, end=ex.prompt_len)
    assert list(events(bad, ex.prompt_len, errors="stop")) == [root]
    with pytest.raises(TraceError, match="token after the root returned"):
        list(events(list(ex.tokens) + ["x"], ex.prompt_len))
    with pytest.raises(TraceError, match="in the written expression"):
        list(events([CALL] + list(ex.tokens), ex.prompt_len + 1))


def test_reader_modes():
    ex = PAPER.execute("add(square(2),3)")
    r = TraceReader(ex.tokens[:ex.prompt_len])
    got = [r.feed(t) for t in ex.tokens[ex.prompt_len:]]
    assert [g for g in got if g] == [PUSH, POP, DONE] and r.answer == r.value == ["7"] and r.n_cuts == 3
    assert r.feed("x") == ERROR and r.feed("y") == ERROR and r.error == "token after the root returned"
    lenient = TraceReader(legal=False)
    for t in list(ex.tokens) + ["x", END_CALL, "<pad>"]:
        assert lenient.feed(t) != ERROR
    assert lenient.top == active_frame(list(ex.tokens) + ["x", END_CALL, "<pad>"])


# --- each reader against the one it replaced -------------------------------------------


def reduction(seq):
    """What the reduction yields where calls complete, and the reduced sequence."""
    out = []
    return list(_collapses(seq, out)), out


def old_reduction(seq):
    steps = list(old_reduction_steps(seq))
    return [b for _, b in steps if b is not None], (steps[-1][0] if steps else [])


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(_ALPHABET), max_size=40))
def test_pi_rec_and_the_reduction_are_the_replaced_ones_on_any_sequence(seq):
    assert active_frame(seq) == old_active_frame(seq)
    assert reduction(seq) == old_reduction(seq)
    assert completed_calls(seq, 0) == old_completed_calls(seq, 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_readers_on_random_and_corrupted_traces_are_the_replaced_ones(seed):
    ex = sampled(seed)
    rng = random.Random(seed)
    for seq in (list(ex.tokens), corrupted(ex, rng), corrupted(ex, rng)):
        for n in sorted({rng.randrange(len(seq) + 1) for _ in range(3)} | {len(seq)}):
            assert active_frame(seq[:n]) == old_active_frame(seq[:n])
            assert reduction(seq[:n]) == old_reduction(seq[:n])
        assert completed_calls(seq, ex.prompt_len) == old_completed_calls(seq, ex.prompt_len)


def test_shortcut_readers_are_the_replaced_ones(random_exprs):
    for e in random_exprs:
        ex = PAPER.execute(e)
        assert root_payload(ex.frames, ex.prompt_len) == old_root_payload(ex)
        tree = frame_tree(ex.tokens, ex.prompt_len)
        for f in [tree, *descendants(tree)]:
            assert internal_returns(ex.tokens, f) == old_internal_returns(ex.tokens, f)
            assert sum(1 for d in descendants(f) if d.call[0] == f.call[0]) == old_recursions(ex.tokens, f)

"""Properties over many random expressions: executor vs evaluator, replay vs executor, fast vs reference."""

from hypothesis import given, settings
from hypothesis import strategies as st

from rlmlab.task.expr import to_text, tokens
from rlmlab.task.frames import StackReplay, active_frame, check_prefix, cut_examples
from rlmlab.task.taskfile import load_task
from rlmlab.task.vocab import CONTROL

PAPER = load_task("paper")


def test_trace_value_equals_direct_evaluation(random_exprs):
    for e in random_exprs:
        ex = PAPER.execute(e)
        assert ex.value == PAPER.evaluate(e)
        r = StackReplay()
        for t in ex.tokens:
            r.feed(t)
        assert r.done and r.answer == [ex.value_token]


def test_parse_print_roundtrip(random_exprs):
    for e in random_exprs:
        assert PAPER.parse(to_text(e)) == e
        assert PAPER.parse(" ".join(tokens(e))) == e


def test_fast_stats_equal_executed_stats(random_exprs):
    for e in random_exprs:
        ex, s = PAPER.execute(e), PAPER.trace_stats(e)
        assert (s.value, s.trace_len, s.max_depth, s.max_frame_width, s.n_frame_examples) == \
               (ex.value, ex.trace_len, ex.max_depth, ex.max_frame_width, ex.n_frame_examples)


def test_replay_cuts_the_executors_frames(random_exprs):
    for e in random_exprs[:300]:
        ex = PAPER.execute(e)
        assert cut_examples(ex.tokens, ex.prompt_len) == list(ex.frames)
        assert check_prefix(ex.tokens) is None


def test_every_prefix_shows_the_executors_active_frame(random_exprs):
    """Replaying any prefix of a trace yields the frame the executor had active there."""
    for e in random_exprs[:60]:
        ex = PAPER.execute(e)
        pos = ex.prompt_len
        for f in ex.frames:
            for k in range(len(f.targets)):
                # before emitting targets[k] the model sees context + targets[:k]
                assert active_frame(ex.tokens[:pos + k]) == list(f.context + f.targets[:k])
            pos += len(f.targets)
        assert pos == ex.trace_len


def test_incremental_replay_matches_paper_map(random_exprs):
    for e in random_exprs[:50]:
        ex = PAPER.execute(e)
        r = StackReplay()
        for i, t in enumerate(ex.tokens):
            r.feed(t)
            assert r.top == active_frame(ex.tokens[:i + 1])


def test_active_frame_idempotent_on_trace_prefixes(random_exprs):
    for e in random_exprs[:100]:
        ex = PAPER.execute(e)
        for i in range(0, ex.trace_len, 3):
            f = active_frame(ex.tokens[:i])
            assert active_frame(f) == f


_ALPHABET = list(CONTROL) + ["add", "(", ")", "2", "x", ":=", "return"]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_ALPHABET), max_size=40))
def test_active_frame_idempotent_on_any_sequence(seq):
    f = active_frame(seq)
    assert active_frame(f) == f


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_ALPHABET), max_size=30))
def test_legal_prefixes_agree_with_the_paper_map(seq):
    if check_prefix(seq) is None:
        r = StackReplay()
        for t in seq:
            r.feed(t)
        assert r.top == active_frame(seq)


def test_illegal_prefixes_are_named():
    cases = {"add ( 2 ) </call>": "</call> with no open <call>",
             "x := <call> <call>": "<call> inside a call payload",
             "x := <call> </call>": "empty call payload",
             "x := <call> a </return>": "</return> with no open <return>",
             "return <return> 3 </return> y": "token after the root returned",
             "x <pad>": "model-level token"}
    for seq, why in cases.items():
        assert why in check_prefix(seq.split()), seq


def test_every_trace_token_is_in_the_vocabulary(random_exprs):
    vocab = PAPER.vocab
    for e in random_exprs[:200]:
        vocab.encode(PAPER.execute(e).tokens)

"""Training examples: CoT and RM read the same executions; only what is visible and what is a target differ."""

import numpy as np
import pytest

from rlmlab.errors import ConfigError, DataError
from rlmlab.learning.examples import (
    PACKINGS,
    Example,
    ExampleSet,
    build_examples,
    cot_packing,
    get_packing,
    rm_frames_packing,
)
from rlmlab.task.expr import to_text
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

WORKED = "add(sum_of_squares(2,3),double(4))"


def test_worked_example_gives_11_rm_examples_with_loss_after_m():
    ex = PAPER.execute(WORKED)
    examples = rm_frames_packing(ex)
    assert len(examples) == 11
    assert [e.loss_positions[0] for e in examples] == [14, 6, 12, 4, 15, 4, 18, 15, 17, 4, 20]
    assert " ".join(examples[0].targets) == "x := <call> sum_of_squares ( 2 , 3 ) </call>"
    assert " ".join(examples[7].targets) == "</return>"
    assert " ".join(examples[-1].tokens) == ("add ( sum_of_squares ( 2 , 3 ) , double ( 4 ) ) x := 3 y := 8 "
                                             "return <return> 1 </return>")


def test_worked_example_cot_is_the_whole_trace_with_loss_after_the_prompt():
    ex = PAPER.execute(WORKED)
    [example] = cot_packing(ex)
    assert example.tokens == ex.tokens and len(example.tokens) == 100
    assert example.loss_positions == list(range(14, 100))


def test_views_on_random_expressions(random_exprs):
    for e in random_exprs[:300]:
        ex = PAPER.execute(e)
        [cot] = cot_packing(ex)
        assert cot.loss_positions == list(range(ex.prompt_len, ex.trace_len))
        rm = rm_frames_packing(ex)
        assert len(rm) == ex.n_frame_examples
        for example, frame in zip(rm, ex.frames):
            assert example.tokens == frame.tokens
            assert example.loss_positions == list(range(frame.m, frame.width))
        # The same target computation: RM's targets, frame after frame, are CoT's targets.
        assert sum((x.targets for x in rm), ()) == cot.targets


def test_registry_and_example_checks():
    assert set(PACKINGS) == {"cot", "rm", "rm-frames"} and get_packing("rm-frames") is rm_frames_packing
    with pytest.raises(ConfigError, match="unknown learner"):
        get_packing("window")
    with pytest.raises(ValueError):
        Example(("a", "b"), (True, True))


def test_view_data_matches_the_view_and_caches(tmp_path, random_exprs):
    vocab = PAPER.vocab
    texts = [to_text(e) for e in random_exprs[:40]]
    for learner in ("cot", "rm", "rm-frames"):
        data = build_examples(texts, learner, vocab, cache_dir=tmp_path, task=PAPER)
        expected = [(k, x) for k, t in enumerate(texts) for x in PACKINGS[learner](PAPER.execute(t))]
        assert len(data) == len(expected) and data.n_expressions == 40
        for i, (k, x) in enumerate(expected):
            assert data.decode(i) == x and data.source[i] == k
        [cached] = tmp_path.glob(f"{learner}-*.npz")
        again = build_examples(texts, learner, vocab, cache_dir=tmp_path, task=PAPER)
        assert np.array_equal(again.ids, data.ids) and np.array_equal(again.offsets, data.offsets)
        cached.write_bytes(b"damaged")  # a bad cache entry is rebuilt, not trusted
        assert np.array_equal(build_examples(texts, learner, vocab, cache_dir=tmp_path, task=PAPER).loss, data.loss)
    assert build_examples(texts, "rm", vocab, workers=2, chunk=7, task=PAPER).ids.tolist() == \
        build_examples(texts, "rm", vocab, task=PAPER).ids.tolist()


def test_view_data_select_save_load(tmp_path):
    data = build_examples(["add(1,2)", WORKED, "less(3,4)"], "rm", PAPER.vocab, task=PAPER)
    keep = data.lengths > 10
    sub = data.select(keep)
    assert len(sub) == int(keep.sum())
    assert [sub.decode(i) for i in range(len(sub))] == [data.decode(i) for i in np.flatnonzero(keep)]
    sub.save(tmp_path / "v.npz")
    back = ExampleSet.load(tmp_path / "v.npz")
    assert back.learner == "rm" and np.array_equal(back.ids, sub.ids) and np.array_equal(back.source, sub.source)
    with pytest.raises(DataError, match="no such file"):
        ExampleSet.load(tmp_path / "missing.npz")


def test_bad_expression_is_a_data_error():
    with pytest.raises(DataError, match="expression 1"):
        build_examples(["add(1,2)", "add(1,"], "cot", PAPER.vocab, task=PAPER)


def test_lane_view_trains_on_exactly_the_frame_targets(random_exprs):
    """The lane-packed RM packing is one sequence per frame instance (the root and one per call),
    holding every active-frame example's targets once, in fewer tokens."""
    for e in random_exprs[:200]:
        ex = PAPER.execute(e)
        lanes = get_packing("rm")(ex)
        frames = rm_frames_packing(ex)
        assert len(lanes) == 1 + ex.tokens.count("<call>")
        assert all(len({f for _, f, _ in lane.layout}) == 1 for lane in lanes)
        assert len({lane.layout[0][1] for lane in lanes}) == len(lanes)
        assert sorted(sum((lane.targets for lane in lanes), ())) == sorted(sum((f.targets for f in frames), ()))
        assert sum(len(lane.tokens) for lane in lanes) <= sum(len(f.tokens) for f in frames)
        assert max(p for lane in lanes for p, _, _ in lane.layout) < ex.max_frame_width

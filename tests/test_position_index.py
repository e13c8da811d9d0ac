"""`model.position_index`: CoT's trace tokens at their places in RM's active frames ("frame"),
RM's frame tokens at their places in the flattened trace ("trace"). Hand-written traces,
properties over random expressions, training rows, the KV-cached decoder against recomputation,
teacher-forced scoring against each example run alone, checkpoints and refusals."""

import numpy as np
import pytest
import torch
from conftest import Recorder, one_line_error, sample_expressions
from test_infer import WORKED, _assert_canonical, _assert_same_logits

from rlmlab.attention.position_index import example_positions, frame_positions, trace_places_of_frames
from rlmlab.decoding.driver import Limits, generate
from rlmlab.decoding.engine import ModelPredictor
from rlmlab.decoding.oracle import oracle_predictor
from rlmlab.decoding.predictor import TeacherForced
from rlmlab.errors import ConfigError
from rlmlab.learning.checkpoint import load_run, save_checkpoint
from rlmlab.learning.config import ModelConfig, RunConfig, apply_overrides
from rlmlab.learning.examples import build_examples, indexed_packing
from rlmlab.learning.lanes import lane_pack
from rlmlab.learning.model import Transformer, preset
from rlmlab.learning.observe import observer
from rlmlab.learning.packing import Row, collate
from rlmlab.measuring.score import per_token_hits
from rlmlab.measuring.teacher import teacher_forced_argmax
from rlmlab.task.expr import to_text
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

VOCAB = PAPER.vocab
pytestmark = pytest.mark.usefixtures("one_torch_thread")

# `rlmlab trace "add(square(2),3)"`:
#   add ( square ( 2 ) , 3 ) x := <call> square ( 2 ) </call> x := 2 return <return> 4 </return>
#   y := 3 return <return> 7 </return>
SMALL = "add(square(2),3)"


def test_frame_index_of_a_hand_written_trace():
    ex = PAPER.execute(SMALL)
    # The root frame counts from the prompt's first token; the child's body follows its payload
    # (RM's child frame is `square ( 2 ) x := ...`); after the return the caller goes on at its
    # `<call>`'s place (11) plus the value's length (1): RM's `add ( ... ) x := 4 y ...`.
    assert frame_positions(ex.tokens, ex.prompt_len) == [*range(17), *range(4, 11), *range(12, 19)]


def test_trace_index_of_a_hand_written_trace():
    ex = PAPER.execute(SMALL)
    assert trace_places_of_frames(ex.tokens, ex.prompt_len) == [
        list(range(17)),                                      # the root up to its </call>
        [12, 13, 14, 15, *range(17, 24)],                     # payload where the caller wrote it
        [*range(11), 22, *range(24, 31)],                     # the value where the child wrote it
    ]
    (root, child) = indexed_packing("rm", "trace")(ex)  # one lane per frame instance
    assert [p for p, _, _ in child.layout] == [12, 13, 14, 15, *range(17, 24)]
    # the root's lane: its trunk, the pending call block on a branch, then the trunk again
    assert [p for p, _, _ in root.layout] == [*range(17), 22, *range(24, 31)]


@pytest.fixture(scope="module")
def executions():
    return [PAPER.execute(e) for e in sample_expressions(300, 41)]


def test_cot_targets_sit_where_rm_predicts_them(executions):
    """Every generated token is the target of exactly one RM example: its "frame" index in the
    flattened trace is its place in that example."""
    rm = observer("rm")
    for ex in executions:
        rm_places = [m + j for toks, m in rm.examples(ex.tokens, ex.prompt_len) for j in range(len(toks) - m)]
        assert frame_positions(ex.tokens, ex.prompt_len)[ex.prompt_len:] == rm_places, ex.expr


def test_rm_tokens_sit_where_the_trace_wrote_them(executions):
    """Each token of each RM example at its "trace" index is the trace's token there; the targets'
    places are the generated tokens' places, in order; places increase within an example."""
    rm = observer("rm")
    for ex in executions:
        examples = rm.examples(ex.tokens, ex.prompt_len)
        places = trace_places_of_frames(ex.tokens, ex.prompt_len)
        assert [len(p) for p in places] == [len(t) for t, _ in examples]
        for (toks, m), at in zip(examples, places):
            assert [ex.tokens[p] for p in at] == list(toks)
            assert all(a < b for a, b in zip(at, at[1:]))
        assert [p for (toks, m), at in zip(examples, places) for p in at[m:]] == list(
            range(ex.prompt_len, len(ex.tokens)))
        for lane in indexed_packing("rm", "trace")(ex):
            assert [ex.tokens[p] for p, _, _ in lane.layout] == list(lane.tokens)


def test_each_learner_at_its_own_index_is_unchanged(executions):
    for ex in executions[:20]:
        assert indexed_packing("cot", "trace")(ex) == indexed_packing("cot", None)(ex)
        assert indexed_packing("rm", "frame")(ex) == indexed_packing("rm", None)(ex)
        assert example_positions("cot", "trace", ex.tokens, ex.prompt_len) is None
        lanes = lane_pack(ex.tokens, ex.prompt_len)
        assert [ex.tokens[p] for p in lanes.flat] == lanes.tokens


def test_training_rows_carry_the_index_and_stay_plain_causal():
    exprs = [to_text(e) for e in sample_expressions(40, 42)]
    data = build_examples(exprs, "cot", VOCAB, position_index="frame", task=PAPER)
    plain = build_examples(exprs, "cot", VOCAB, task=PAPER)
    assert np.array_equal(data.ids, plain.ids) and np.array_equal(data.loss, plain.loss)
    first = PAPER.execute(exprs[0])
    assert data.layout[data.offsets[0]:data.offsets[1], 0].tolist() == frame_positions(first.tokens, first.prompt_len)
    rows = [Row(int(data.lengths[i]) - 1, (i,)) for i in range(3)]
    for r in rows:
        batch = collate(data.ids, data.loss, data.offsets, [r], VOCAB.pad_id, data.layout)
        assert batch.frame is None  # no lanes: plain causal attention with these positions
        i = r.examples[0]
        assert batch.pos[0].tolist() == data.layout[data.offsets[i]:data.offsets[i + 1] - 1, 0].tolist()
    rm = build_examples(exprs, "rm", VOCAB, position_index="trace", task=PAPER)
    longest = max(PAPER.execute(e).trace_len for e in exprs)
    assert int(rm.positions_needed.max()) == longest  # the root's last lane ends at the trace's last place


def _model(learner, positions, index, seed, block_size=None):
    torch.manual_seed(seed)
    extra = {} if block_size is None else {"block_size": block_size}
    model = Transformer(preset("tiny", learner, len(VOCAB), positions=positions, position_index=index, **extra)).eval()
    with torch.no_grad():  # weights that make logits depend visibly on positions
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
    return model


class _Feeds:
    """Wraps a predictor and keeps every feed's (seq, pos)."""

    def __init__(self, inner):
        self.inner, self.block_size, self.position_index = inner, inner.block_size, inner.position_index
        self.fed = []

    def reset(self, n):
        self.inner.reset(n)

    def __call__(self, feeds):
        self.fed.extend((tuple(f.seq), tuple(f.pos)) for f in feeds)
        return self.inner(feeds)


@pytest.mark.parametrize("learner, index", [("cot", "frame"), ("rm", "trace")])
def test_the_decoder_places_tokens_as_training_does(learner, index):
    exprs = [WORKED] + [e for e in sample_expressions(80, 43) if PAPER.execute(e).trace_len <= 200][:6]
    rec = _Feeds(ModelPredictor(_model(learner, "learned", index, 1)))
    for e in exprs:
        rec.fed.clear()
        gens = generate(TeacherForced(rec, oracle_predictor(learner, VOCAB, library=PAPER.library)), [e], VOCAB, learner, batch_size=1, library=PAPER.library)
        _assert_canonical(gens, [e])
        ex = PAPER.execute(e)
        obs = observer(learner)
        for (toks, m), at in zip(obs.examples(ex.tokens, ex.prompt_len),
                                 example_positions(learner, index, ex.tokens, ex.prompt_len)):
            # the state that predicts an example's last target reads the example but its last token
            assert (tuple(VOCAB.encode(toks[:-1])), tuple(at[:-1])) in rec.fed, (e, toks)


@pytest.mark.parametrize("positions", ["learned", "rope", "none"])
@pytest.mark.parametrize("learner, index", [("cot", "frame"), ("rm", "trace")])
def test_cached_logits_equal_recomputed(learner, index, positions):
    """Past the training length too: the model is untrained, and the traces run to 300 tokens."""
    model = _model(learner, positions, index, 2)
    exprs = [WORKED] + [e for e in sample_expressions(80, 44) if PAPER.execute(e).trace_len <= 300][:8]
    logs = []
    for use_cache in (True, False):
        rec = Recorder(ModelPredictor(model, use_cache=use_cache))
        gens = generate(TeacherForced(rec, oracle_predictor(learner, VOCAB, library=PAPER.library)), exprs, VOCAB, learner, batch_size=4, library=PAPER.library)
        _assert_canonical(gens, exprs)
        logs.append(rec.log)
    _assert_same_logits(*logs)
    free = [generate(ModelPredictor(model, use_cache=c), exprs, VOCAB, learner, Limits(max_new_tokens=60),
                     batch_size=4, library=PAPER.library) for c in (True, False)]
    assert [g.tokens for g in free[0]] == [g.tokens for g in free[1]]


def test_a_row_placed_beyond_the_table_stops_as_invalid():
    model = _model("rm", "learned", "trace", 3, block_size=64)
    long = next(e for e in sample_expressions(200, 45) if PAPER.execute(e).trace_len > 80)
    (g,) = generate(TeacherForced(ModelPredictor(model), oracle_predictor("rm", VOCAB, library=PAPER.library)), [long], VOCAB, "rm",
                    batch_size=1, library=PAPER.library)
    assert not g.valid and "beyond the model's block size 64" in g.reason


@pytest.mark.parametrize("learner, index", [("cot", "frame"), ("rm", "trace")])
def test_teacher_forced_scores_read_each_example_at_its_places(learner, index):
    model = _model(learner, "learned", index, 4)
    exs = [PAPER.execute(e) for e in [WORKED] + sample_expressions(12, 46)]
    hits = per_token_hits(model, VOCAB, learner, exs)
    obs = observer(learner)
    for ex, h in zip(exs, hits):
        want = []
        for (toks, m), at in zip(obs.examples(ex.tokens, ex.prompt_len),
                                 example_positions(learner, index, ex.tokens, ex.prompt_len)):
            ids = torch.tensor([VOCAB.encode(toks)])
            with torch.no_grad():
                pred = model(ids, torch.tensor([at])).argmax(-1)[0]
            want.extend((pred[m - 1:-1] == ids[0, m:]).tolist())
        assert h.tolist() == want
    # and not at 0..n-1: the index changes what is read
    plain = teacher_forced_argmax(model, [(VOCAB.encode(exs[0].tokens), exs[0].prompt_len)])
    placed = teacher_forced_argmax(model, [(VOCAB.encode(exs[0].tokens), exs[0].prompt_len)], positions=[
        frame_positions(exs[0].tokens, exs[0].prompt_len)]) if learner == "cot" else None
    if placed is not None:
        assert plain != placed


def test_a_checkpoint_keeps_its_index(tmp_path):
    m = _model("rm", "learned", "trace", 5)
    cfg = apply_overrides(RunConfig(), ["model.preset=tiny", "model.position_index=trace"]).to_dict()
    save_checkpoint(tmp_path / "run", "best", m, vocab=VOCAB, learner="rm", config=cfg, step=1, metrics={})
    loaded = load_run(tmp_path / "run")
    assert loaded.model.cfg.position_index == "trace"
    assert ModelPredictor(loaded.model).position_index == "trace"


def test_refusals(capsys):
    with pytest.raises(ConfigError, match="position_index must be one of trace, frame"):
        ModelConfig(position_index="middle")
    with pytest.raises(ConfigError, match="cannot be combined with model.positions=alibi"):
        ModelConfig(positions="alibi", position_index="frame")
    with pytest.raises(ConfigError, match="applies to the cot and rm learners only"):
        build_examples(["add(1,2)"], "window:8", VOCAB, position_index="frame", task=PAPER)
    with pytest.raises(ConfigError, match="not implemented for the 'rm-frames' packing"):
        build_examples(["add(1,2)"], "rm-frames", VOCAB, position_index="trace", task=PAPER)
    err = one_line_error(capsys, ["train", "--learner", "cot", "--model.position_index=middle", "--out", "/nonexistent/x"],
                         from_command=False)
    assert "position_index" in err


def test_the_invariance_probe_refuses_another_index():
    from rlmlab.measuring.probe import forced_predictions

    model = _model("cot", "learned", "frame", 6)
    with pytest.raises(ConfigError, match="invariance probe reads models at their learner's own positions"):
        forced_predictions(ModelPredictor(model), [(VOCAB.encode(PAPER.execute(SMALL).tokens), 9)])

"""Position encodings (`model.positions`): what each one reads of `pos`, and that every fast path
computes what the reference computes under each of them: packed rows and block
attention against examples run alone, the KV cache against recomputation (CoT decoder and RM
stack driver), lane-packed RM training against per-frame examples, and CoT simulating RM."""

import json

import pytest
import torch
from conftest import Recorder, sample_expressions
from hypothesis import given, settings
from hypothesis import strategies as st
from test_infer import WORKED, Script, _assert_canonical, _assert_same_logits
from test_packing import _step_loss_and_grads

from rlmlab.attention.backends import Blocks, Dense
from rlmlab.attention.layout import Layout
from rlmlab.attention.positions import alibi_slopes
from rlmlab.cli import main
from rlmlab.decoding.driver import Limits, generate
from rlmlab.decoding.engine import ModelPredictor
from rlmlab.decoding.oracle import oracle_predictor
from rlmlab.decoding.predictor import TeacherForced
from rlmlab.errors import CheckpointError, ConfigError
from rlmlab.learning.checkpoint import load_run, meta_digest, save_checkpoint
from rlmlab.learning.config import ModelConfig, ModelSettings, RunConfig, apply_overrides
from rlmlab.learning.data import fit_to_block
from rlmlab.learning.examples import build_examples
from rlmlab.learning.model import Transformer, preset
from rlmlab.measuring.simulate import simulate_rm
from rlmlab.task.expr import to_text
from rlmlab.task.frames import active_frame
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

VOCAB = PAPER.vocab
ENCODINGS = ["learned", "none", "rope", "alibi"]
OTHERS = ["none", "rope", "alibi"]  # the learned table's paths are tested in test_model/test_infer/test_packing

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model(learner, positions, seed=0, scale=1.0, **overrides):
    """A tiny model whose weights are scaled up from the default init (std 0.02), so that its
    logits depend visibly on positions and a wrong rotation or bias cannot hide in near-uniform outputs."""
    torch.manual_seed(seed)
    model = Transformer(preset("tiny", learner, len(VOCAB), positions=positions, **overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, scale / p.shape[-1] ** 0.5)
    return model


# --- configuration and what each encoding reads -------------------------------------------------

def test_learned_is_the_default_and_the_only_encoding_with_a_table():
    assert ModelConfig().positions == ModelSettings().positions == "learned"
    assert RunConfig().model.build("cot", len(VOCAB)).positions == "learned"
    for enc in ENCODINGS:
        m = Transformer(preset("tiny", "rm", len(VOCAB), positions=enc))
        assert ("wpe.weight" in m.state_dict()) == (enc == "learned")
        assert (m.num_params() - m.num_params(include_positions=False) > 0) == (enc == "learned")
    cfg = apply_overrides(RunConfig(), ["model.positions=rope"])
    assert cfg.model.build("rm", len(VOCAB)).positions == "rope"
    for bad in ("model.positions=sinusoidal", "model.positions=Rope"):
        with pytest.raises(ConfigError, match="model.positions must be one of learned, none, rope, alibi"):
            apply_overrides(RunConfig(), [bad])
    with pytest.raises(ConfigError, match="model.positions"):
        ModelConfig(positions=3)


def test_alibi_slopes_are_the_papers_geometric_sequence():
    assert alibi_slopes(8).tolist() == [2.0 ** -(i + 1) for i in range(8)]
    six = alibi_slopes(6).tolist()  # the 4-head slopes, then every other one of the 8-head slopes (the reference code)
    assert six == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])


@settings(max_examples=25, deadline=None)
@given(shift=st.integers(1, 3000), T=st.integers(2, 24), seed=st.integers(0, 3))
def test_each_encoding_reads_what_it_should_of_pos(shift, T, seed):
    """NoPE ignores pos; RoPE and ALiBi read only differences of positions (a shift changes
    nothing, a permutation does); the learned table reads absolute positions."""
    idx = torch.randint(0, len(VOCAB), (2, T), generator=torch.Generator().manual_seed(seed))
    pos = torch.arange(T).expand(2, T)
    scrambled = torch.randperm(T, generator=torch.Generator().manual_seed(seed + 1)).expand(2, T)
    for enc in ENCODINGS:
        m = _model("cot", enc, seed, block_size=4096)
        with torch.no_grad():
            base, shifted, permuted = m(idx, pos), m(idx, pos + shift), m(idx, scrambled)
        if enc == "learned":
            assert not torch.allclose(base, shifted, atol=1e-3)
        else:
            torch.testing.assert_close(shifted, base, atol=2e-4, rtol=1e-4)
        if enc == "none":
            torch.testing.assert_close(permuted, base, atol=1e-5, rtol=1e-5)
        elif not torch.equal(scrambled, pos):
            assert not torch.allclose(base, permuted, atol=1e-3)


# --- packed rows and block attention: every example computes what it computes alone ----------------

@pytest.mark.parametrize("positions", ENCODINGS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_packed_rows_equal_examples_alone_through_every_attention_path(positions, data):
    """Random packed rows, each example counting its positions from 0: the dense mask, the
    blocks (small pieces, so that blocks are cut and padded) and each example alone
    under plain causal attention give the same logits at every example position."""
    B, T = data.draw(st.integers(1, 3)), data.draw(st.integers(2, 40))
    row, start, length = [], [], []
    for r in range(B):
        t = 0
        while t < T:
            n = data.draw(st.integers(1, T - t))
            row.append(r), start.append(t), length.append(n)
            t += n
    row, start, length = (torch.tensor(a) for a in (row, start, length))
    idx = torch.randint(0, len(VOCAB), (B, T), generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    pos = torch.zeros(B, T, dtype=torch.long)
    dense = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for r, s, n in zip(row.tolist(), start.tolist(), length.tolist()):
        pos[r, s:s + n] = torch.arange(n)
        dense[r, 0, s:s + n, s:s + n] = torch.ones(n, n, dtype=torch.bool).tril()
    blocks = Blocks(Layout.packed(B, T, row, start, length), chunk=data.draw(st.integers(1, 8)),
                    max_pieces=data.draw(st.integers(1, 4)))
    m = _model("cot", positions, 1)
    with torch.no_grad():
        by_mask, by_blocks = m(idx, pos, Dense.from_mask(dense)), m(idx, pos, blocks)
        for r, s, n in zip(row.tolist(), start.tolist(), length.tolist()):
            alone = m(idx[r:r + 1, s:s + n])[0]
            torch.testing.assert_close(by_mask[r, s:s + n], alone, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(by_blocks[r, s:s + n], alone, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("positions", OTHERS)
def test_packed_training_gradients_equal_one_by_one(positions):
    """Gradients through the biased/rotated block attention equal those of the dense mask."""
    torch.manual_seed(0)
    texts = [to_text(e) for e in sample_expressions(12, 31)]
    data = build_examples(texts, "cot", VOCAB, task=PAPER)
    data = data.select(data.lengths - 1 <= 600)
    m = _model("cot", positions, 2, scale=0.5)
    loss_d, n_d, grad_d = _step_loss_and_grads(m, data, 256, fast=False)
    loss_b, n_b, grad_b = _step_loss_and_grads(m, data, 256, fast=True)
    assert n_d == n_b and abs(loss_d - loss_b) < 1e-5 * loss_d
    torch.testing.assert_close(grad_b, grad_d, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("fast", [False, True], ids=["dense-mask", "block-attention"])
@pytest.mark.parametrize("positions", OTHERS)
def test_lane_packed_rm_equals_per_frame_rm_loss_and_update(positions, fast):
    """Lane packing gives a call block the positions its own frame example has, so the lane-packed
    RM objective stays the per-frame one exactly under every encoding: same mean loss and
    gradient (test_packing holds the learned table to the same)."""
    torch.manual_seed(0)
    texts = [WORKED] + [to_text(e) for e in sample_expressions(30, 32)]
    lanes = build_examples(texts, "rm", VOCAB, task=PAPER)
    frames = build_examples(texts, "rm-frames", VOCAB, task=PAPER)
    m = _model("rm", positions, 3, scale=0.5)
    loss_l, n_l, grad_l = _step_loss_and_grads(m, lanes, 512, fast)
    loss_f, n_f, grad_f = _step_loss_and_grads(m, frames, 128)
    assert n_l == n_f
    assert abs(loss_l - loss_f) < 1e-5 * loss_f
    torch.testing.assert_close(grad_l, grad_f, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("positions", ENCODINGS)
def test_cot_simulates_rm_under_every_encoding(positions):
    """The simulation (paper: CoT can simulate RM) holds for every encoding because it hands the
    model RM's own positions and lane mask: each lane restarts at its frame's positions. It is
    a statement about one Transformer given those inputs; a CoT model reading the flattened
    trace with positions 0..n-1 is not the simulating model under any encoding."""
    m = _model("rm", positions, 4)
    for ex in [PAPER.execute(WORKED)] + [PAPER.execute(e) for e in sample_expressions(4, 33)]:
        got = simulate_rm(m, VOCAB, ex.tokens, ex.prompt_len)
        frames = [VOCAB.encode(active_frame(ex.tokens[:t])) for t in range(ex.prompt_len, ex.trace_len + 1)]
        with torch.no_grad():
            want = [VOCAB.tokens[int(m(torch.tensor(f)[None])[0, -1].argmax())] for f in frames]
        assert got == want


# --- the KV cache equals recomputation ---------------------------------------------------------

def _forced(model, learner, exprs, use_cache, batch_size):
    rec = Recorder(ModelPredictor(model, use_cache=use_cache))
    gens = generate(TeacherForced(rec, oracle_predictor(learner, VOCAB, library=PAPER.library)), exprs, VOCAB, learner, batch_size=batch_size, library=PAPER.library)
    _assert_canonical(gens, exprs)
    return rec.log


@pytest.mark.parametrize("positions", OTHERS)
def test_rm_driver_cached_logits_and_greedy_tokens_equal_recomputed(positions):
    model = _model("rm", positions, 5)
    exprs = [WORKED, "fibonacci(4,accum_sum(3,2),factorial(2,1))"]
    exprs += [e for e in sample_expressions(60, 21) if PAPER.execute(e).trace_len <= 300][:10]
    _assert_same_logits(_forced(model, "rm", exprs, True, 5), _forced(model, "rm", exprs, False, 5))
    free = [generate(ModelPredictor(model, use_cache=c), exprs, VOCAB, "rm", Limits(max_new_tokens=80), batch_size=5, library=PAPER.library)
            for c in (True, False)]
    assert [g.tokens for g in free[0]] == [g.tokens for g in free[1]]


@pytest.mark.parametrize("positions", OTHERS)
def test_cot_decoder_cached_logits_and_greedy_tokens_equal_recomputed(positions):
    model = _model("cot", positions, 6)
    exprs = [e for e in sample_expressions(200, 22) if PAPER.execute(e).trace_len <= 160][:10]
    _assert_same_logits(_forced(model, "cot", exprs, True, 4), _forced(model, "cot", exprs, False, 4))
    free = [generate(ModelPredictor(model, use_cache=c), exprs, VOCAB, "cot", Limits(max_new_tokens=80), batch_size=4, library=PAPER.library)
            for c in (True, False)]
    assert [g.tokens for g in free[0]] == [g.tokens for g in free[1]]


@pytest.mark.parametrize("positions", OTHERS)
def test_a_multi_token_return_payload_reads_the_parent_back_under_every_encoding(positions):
    script = "x := <call> double ( 1 ) </call> y := 7 return <return> 3 4 </return> " \
             "return <return> 5 </return>".split()
    model = _model("rm", positions, 7)
    logs = []
    for use_cache in (True, False):
        rec = Recorder(ModelPredictor(model, use_cache=use_cache))
        g = generate(TeacherForced(rec, Script(script)), ["square(2)"], VOCAB, "rm", batch_size=1, library=PAPER.library)[0]
        assert g.valid and g.answer == "5"
        logs.append(rec.log)
    _assert_same_logits(*logs)


# --- the context limit belongs to the learned table only ------------------------------------------

def test_only_the_learned_table_limits_decoding_and_training():
    long = next(e for e in sample_expressions(200, 34) if PAPER.execute(e).trace_len > 40)
    guide = lambda: oracle_predictor("cot", VOCAB, library=PAPER.library)  # noqa: E731
    for enc in ENCODINGS:
        m = _model("cot", enc, 8, block_size=32)
        predictor = ModelPredictor(m)
        assert predictor.block_size == (32 if enc == "learned" else None)
        g = generate(TeacherForced(predictor, guide()), [long], VOCAB, "cot", library=PAPER.library)[0]
        if enc == "learned":
            assert g.reason == "trace of 33 tokens exceeds the model's block size 32"
        else:
            assert g.valid and len(g.tokens) == PAPER.execute(long).trace_len
    data = build_examples([to_text(e) for e in sample_expressions(20, 35)], "cot", VOCAB, task=PAPER)
    assert fit_to_block(data, 64, True, "x")[1] > 0
    kept, dropped = fit_to_block(data, None, True, "x")
    assert dropped == 0 and len(kept) == len(data)


# --- checkpoints --------------------------------------------------------------------------------

def _save(tmp_path, positions, name="run"):
    m = _model("rm", positions, 9)
    cfg = apply_overrides(RunConfig(), [f"model.positions={positions}", "model.preset=tiny"]).to_dict()
    save_checkpoint(tmp_path / name, "best", m, vocab=VOCAB, learner="rm", config=cfg, step=1, metrics={})
    return m, tmp_path / name


@pytest.mark.parametrize("positions", ENCODINGS)
def test_a_checkpoint_records_its_encoding_and_refuses_another(tmp_path, positions):
    m, run = _save(tmp_path, positions)
    meta = json.loads((run / "best" / "checkpoint.json").read_text())
    assert meta["model_config"]["positions"] == meta["config"]["model"]["positions"] == positions
    loaded = load_run(run, encoding=positions)
    x = torch.randint(0, len(VOCAB), (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), m(x), atol=0, rtol=0)
    other = next(e for e in ENCODINGS if e != positions)
    with pytest.raises(CheckpointError, match=f"trained with model.positions={positions}, not {other}$"):
        load_run(run, encoding=other)


@pytest.mark.parametrize("positions, named", [("learned", "rm"), ("rope", "rm@rope"), ("none", "rm@none")])
def test_eval_probe_and_frames_label_a_run_with_its_encoding(tmp_path, capsys, positions, named):
    """A summary written from a run folder names the learner as `rlmlab run` does ("rm@rope"),
    so tables and the viewer label it by its encoding; the learned table keeps the plain name."""
    _, run = _save(tmp_path, positions)
    data = tmp_path / "set.txt"
    data.write_text("square(double(3))\nadd(1,2)\n")
    argv = {"eval": ["--quiet"], "probe": ["--positions-only", "--quiet"], "frames": ["--train", str(data)]}
    for command, extra in argv.items():
        out = tmp_path / command
        assert main([command, str(run), "--data", str(data), "--out", str(out), *extra]) == 0, capsys.readouterr().err
        assert json.loads((out / "summary.json").read_text())["learner"] == named, command
    assert f"learner {named}" in capsys.readouterr().out


def test_a_checkpoint_without_the_field_is_the_learned_table(tmp_path):
    m, run = _save(tmp_path, "learned")
    path = run / "best" / "checkpoint.json"
    meta = json.loads(path.read_text())
    del meta["model_config"]["positions"], meta["config"]["model"]["positions"]  # as written before the option
    meta["digest"] = meta_digest(meta)  # re-sealed: only the missing field is under test
    path.write_text(json.dumps(meta))
    loaded = load_run(run, encoding="learned")
    assert loaded.model.cfg.positions == "learned"
    x = torch.randint(0, len(VOCAB), (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), m(x), atol=0, rtol=0)


@pytest.mark.parametrize("said, has_table", [("rope", True), ("learned", False)])
def test_weights_that_do_not_fit_the_recorded_encoding_are_refused_in_one_line(tmp_path, said, has_table):
    _, run = _save(tmp_path, "learned" if has_table else "none")
    path = run / "best" / "checkpoint.json"
    meta = json.loads(path.read_text())
    meta["model_config"]["positions"] = meta["config"]["model"]["positions"] = said
    meta["digest"] = meta_digest(meta)  # re-sealed: only the encoding checks can refuse it
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="positional table") as e:
        load_run(run)
    assert "\n" not in str(e.value)
    meta["config"]["model"]["positions"] = "alibi"  # the two records disagree
    meta["digest"] = meta_digest(meta)
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="model.positions='alibi'"):
        load_run(run)


def test_cross_entropy_of_an_alibi_model_is_finite_on_fully_padded_rows():
    """Row padding attends to earlier padding at position 0: the bias never makes a row empty."""
    data = build_examples([to_text(e) for e in sample_expressions(8, 36)], "rm", VOCAB, task=PAPER)
    m = _model("rm", "alibi", 10)
    loss, n, grads = _step_loss_and_grads(m, data, 128, fast=False)
    assert n > 0 and torch.isfinite(torch.tensor(loss)) and torch.isfinite(grads).all()


@pytest.mark.parametrize("positions", ENCODINGS)
def test_the_flex_path_of_table_free_encodings_equals_the_block_path(positions):
    """The CUDA training path (one FlexAttention call per layer over packed rows), run in its
    eager form on CPU: NoPE and RoPE compute what the blocks attention computes; ALiBi, whose
    bias that path does not apply, is refused there in one line."""
    from test_gpu_path import cpu_flex

    from rlmlab.attention.flex import Flex

    B, T = 2, 64
    row, start, length = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 20, 0, 41]), torch.tensor([20, 44, 41, 23])
    pos = torch.zeros(B, T, dtype=torch.long)
    for r, s, n in zip(row.tolist(), start.tolist(), length.tolist()):
        pos[r, s:s + n] = torch.arange(n)
    idx = torch.randint(0, len(VOCAB), (B, T), generator=torch.Generator().manual_seed(0))
    m = _model("cot", positions, 11)
    flex = Flex(Layout.packed(B, T, row, start, length))
    with torch.no_grad(), cpu_flex():
        if positions == "alibi":
            with pytest.raises(ValueError, match="ALiBi has no FlexAttention path"):
                m(idx, pos, flex)
            return
        torch.testing.assert_close(m(idx, pos, flex), m(idx, pos, Blocks(Layout.packed(B, T, row, start, length))),
                                   atol=1e-4, rtol=1e-4)

"""The decoding drivers: the oracle reproduces canonical traces through both, the KV-cached path
equals recomputation, and no predictor output can crash the driver."""

import random

import pytest
import torch
from conftest import Recorder, sample_expressions

from rlmlab.decoding.driver import Limits, generate
from rlmlab.decoding.engine import ModelPredictor
from rlmlab.decoding.oracle import OnActiveFrame, Oracle, oracle_predictor
from rlmlab.decoding.predictor import NO_TOKEN, TeacherForced
from rlmlab.errors import ConfigError
from rlmlab.learning.model import Transformer, preset
from rlmlab.task.frames import active_frame
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

VOCAB = PAPER.vocab

pytestmark = pytest.mark.usefixtures("one_torch_thread")
WORKED = "add(sum_of_squares(2,3),double(4))"


def _model(learner, seed=0, **overrides):
    torch.manual_seed(seed)
    return Transformer(preset("tiny", learner, len(VOCAB), **overrides)).eval()


class Script:
    """A predictor for one row that emits a fixed token sequence (then repeats its last token)."""

    def __init__(self, tokens, block_size=None):
        self.ids = [t if isinstance(t, int) else VOCAB.ids[t] for t in tokens]
        self.block_size = block_size

    def reset(self, n_slots):
        self.k = 0

    def __call__(self, feeds):
        assert len(feeds) == 1
        t = self.ids[min(self.k, len(self.ids) - 1)]
        self.k += 1
        return [t]


def _assert_canonical(gens, exprs):
    for g, e in zip(gens, exprs):
        ex = PAPER.execute(e)
        assert g.valid and g.reason is None, (ex.text, g.reason)
        assert tuple(g.tokens) == ex.tokens and g.prompt_len == ex.prompt_len
        assert g.answer == ex.value_token
        assert (g.n_frame_examples, g.max_depth) == (ex.n_frame_examples, ex.max_depth)


# --- the oracle through both drivers ----------------------------------------------------------

def test_oracle_through_the_rm_driver_reproduces_1000_traces(random_exprs):
    gens = generate(oracle_predictor("rm", VOCAB, library=PAPER.library), random_exprs, VOCAB, "rm", batch_size=128, library=PAPER.library)
    _assert_canonical(gens, random_exprs)


def test_oracle_on_the_active_frame_through_the_cot_decoder_reproduces_1000_traces(random_exprs):
    gens = generate(oracle_predictor("cot", VOCAB, library=PAPER.library), random_exprs, VOCAB, "cot", batch_size=128, library=PAPER.library)
    _assert_canonical(gens, random_exprs)


def test_the_cot_composition_shows_the_oracle_exactly_pi_rec_of_the_trace():
    oracle = Oracle(VOCAB, library=PAPER.library)
    seen = []
    composed = OnActiveFrame(lambda frame: seen.append(frame) or oracle.next_id(frame), VOCAB)
    for text in (WORKED, "fibonacci(3,accum_sum(2,1),7)"):
        seen.clear()
        ex = PAPER.execute(text)
        generate(composed, [text], VOCAB, "cot", batch_size=1, library=PAPER.library)
        assert seen == [tuple(VOCAB.encode(active_frame(ex.tokens[:t])))
                        for t in range(ex.prompt_len, ex.trace_len)]


def test_the_rm_oracle_has_no_token_off_its_path():
    # In the CoT decoder the RM oracle sees the whole trace: after the first </call> that is
    # no frame of any call, and the row ends with the oracle's "no token".
    g = generate(Oracle(VOCAB, library=PAPER.library), [WORKED], VOCAB, "cot", library=PAPER.library)[0]
    assert not g.valid and g.reason == "predictor returned no token"
    assert g.tokens[-2] == "</call>"
    assert Oracle(VOCAB, library=PAPER.library).next_id(tuple(VOCAB.encode(["return", "("]))) == NO_TOKEN


# --- KV cache: cached logits equal recomputed ones ------------------------------------------

def _forced_logs(model, learner, exprs, use_cache, batch_size):
    rec = Recorder(ModelPredictor(model, use_cache=use_cache))
    gens = generate(TeacherForced(rec, oracle_predictor(learner, VOCAB, library=PAPER.library)), exprs, VOCAB, learner, batch_size=batch_size, library=PAPER.library)
    _assert_canonical(gens, exprs)
    return rec.log


def _assert_same_logits(a, b):
    assert len(a) == len(b)
    worst = 0.0
    for (feeds_a, la), (feeds_b, lb) in zip(a, b):
        assert feeds_a == feeds_b
        worst = max(worst, (la - lb).abs().max().item())
    assert worst < 1e-4


def test_rm_driver_cached_logits_equal_recomputed_across_calls_and_returns():
    model = _model("rm")
    exprs = [WORKED, "fibonacci(4,accum_sum(3,2),factorial(2,1))"]
    exprs += [e for e in sample_expressions(60, 21) if PAPER.execute(e).trace_len <= 300][:22]
    cached = _forced_logs(model, "rm", exprs, True, 8)  # 24 rows through 8 slots: slots are reused
    _assert_same_logits(cached, _forced_logs(model, "rm", exprs, False, 8))
    frames = [PAPER.execute(e) for e in exprs]
    assert sum(ex.n_frame_examples for ex in frames) > 300 and max(ex.max_depth for ex in frames) >= 10


def test_cot_decoder_cached_logits_equal_recomputed():
    model = _model("cot")
    exprs = [e for e in sample_expressions(200, 22) if PAPER.execute(e).trace_len <= 160][:20]
    _assert_same_logits(_forced_logs(model, "cot", exprs, True, 6), _forced_logs(model, "cot", exprs, False, 6))


def test_rm_driver_feeds_the_model_pi_rec_of_the_trace():
    """At batch 1 the RM driver's observation at every step is active_frame(prefix), and the
    cached logits equal the model run on that frame alone."""
    model = _model("rm", 3)
    for text in (WORKED, "if_then_else(less(2,3),accum_sum(2,0),5)"):
        ex = PAPER.execute(text)
        log = _forced_logs(model, "rm", [text], True, 1)
        assert len(log) == ex.trace_len - ex.prompt_len
        for t, ((feed,), logits) in zip(range(ex.prompt_len, ex.trace_len), log):
            frame = VOCAB.encode(active_frame(ex.tokens[:t]))
            assert feed[1] == frame
            with torch.no_grad():
                alone = model(torch.tensor(frame)[None])[0, -1]
            assert (logits[0] - alone).abs().max().item() < 1e-4


def test_a_multi_token_return_payload_reads_the_parent_back_from_the_cache():
    # A legal but non-canonical trace: the child returns two tokens, the parent goes on.
    script = "x := <call> double ( 1 ) </call> y := 7 return <return> 3 4 </return> " \
             "return <return> 5 </return>".split()
    model = _model("rm", 4)
    logs = []
    for use_cache in (True, False):
        rec = Recorder(ModelPredictor(model, use_cache=use_cache))
        g = generate(TeacherForced(rec, Script(script)), ["square(2)"], VOCAB, "rm", batch_size=1, library=PAPER.library)[0]
        assert g.valid and g.answer == "5" and g.tokens[4:] == script
        logs.append(rec.log)
    after_pop = VOCAB.encode("square ( 2 ) x := 3 4".split())
    assert any(feeds[0][1] == after_pop for feeds, _ in logs[0])
    _assert_same_logits(*logs)


# --- bad output never crashes the driver ----------------------------------------------------

def _loud_model(learner, seed):
    """Random weights at a large scale: unlike the near-uniform default init, its greedy
    output jumps between tokens, control tokens and specials included."""
    model = _model(learner, seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 3.0 / p.shape[-1] ** 0.5)
    return model


@pytest.mark.parametrize("learner", ["rm", "cot"])
def test_random_weight_models_never_raise(learner):
    exprs = sample_expressions(300, 23)
    limits = Limits(max_new_tokens=60)
    reasons = set()
    for model in (_model(learner, 0), _loud_model(learner, 0), _loud_model(learner, 1)):
        gens = generate(ModelPredictor(model), exprs, VOCAB, learner, limits, batch_size=64, library=PAPER.library)
        assert len(gens) == len(exprs)
        for g, e in zip(gens, exprs):
            assert g.expr == PAPER.execute(e).text
            assert g.valid == (g.reason is None)
            assert g.valid or isinstance(g.reason, str) and g.reason
            assert g.n_generated <= limits.max_new_tokens + 1
            reasons.add(g.reason)
    assert len(reasons) >= 5


class Fuzz:
    """Random ids, control tokens and specials over-represented, some outside the vocabulary."""

    block_size = 96

    def __init__(self, seed):
        self.rng = random.Random(seed)
        ids = VOCAB.ids
        self.pool = list(range(-1, len(VOCAB) + 2)) + [ids[t] for t in ("<call>", "</call>", "<return>",
                                                                         "</return>")] * 6

    def reset(self, n_slots):
        """No per-row state."""

    def __call__(self, feeds):
        return [self.rng.choice(self.pool) for _ in feeds]


@pytest.mark.parametrize("learner", ["rm", "cot"])
def test_fuzzed_predictions_end_every_row_with_a_reason(learner):
    exprs = sample_expressions(500, 24)
    gens = generate(Fuzz(5), exprs, VOCAB, learner, Limits(max_depth=6, max_new_tokens=80), batch_size=50, library=PAPER.library)
    reasons = {g.reason.split(" ")[0] if g.reason else None for g in gens}
    assert all(g.valid == (g.reason is None) for g in gens)
    assert len(reasons) >= 6  # many different ways to fail were exercised


@pytest.mark.parametrize("tokens, reason", [
    (["</call>"], "</call> with no open <call>"),
    (["x", ":=", "<call>", "add", "<return>"], "<return> inside an open <call> block"),
    (["x", ":=", "<call>", "<call>"], "<call> inside a call payload"),
    (["x", ":=", "<call>", "</call>"], "empty call payload"),
    (["</return>"], "</return> with no open <return>"),
    (["return", "<return>", "</return>"], "empty return payload"),
    (["x", "<pad>"], "model-level token <pad> inside a trace"),
    (["x", "<bos>"], "model-level token <bos> inside a trace"),
    ([len(VOCAB) + 3], f"token id {len(VOCAB) + 3} outside the vocabulary"),
    (["return", "<return>", "1", "</return>", "x"], None),  # done at </return>: the rest never asked
])
@pytest.mark.parametrize("learner", ["rm", "cot"])
def test_each_kind_of_bad_output_is_named(tokens, reason, learner):
    g = generate(Script(tokens), ["square(2)"], VOCAB, learner, library=PAPER.library)[0]
    assert g.reason == reason and g.valid == (reason is None)
    if reason is None:
        assert g.answer == "1" and g.tokens[-1] == "</return>"


def test_limits_end_runaway_rows():
    recurse = "x := <call> square ( 2 ) </call>".split()
    for learner in ("rm", "cot"):  # limits apply to the produced trace whatever the learner
        g = generate(Script(recurse * 100), ["square(2)"], VOCAB, learner, Limits(max_depth=10), library=PAPER.library)[0]
        assert g.reason == "deeper than 10 frames" and g.max_depth == 11
        g = generate(Script(["x"]), ["square(2)"], VOCAB, learner, Limits(max_frame_tokens=12), library=PAPER.library)[0]
        assert g.reason == "active frame longer than 12 tokens"
    g = generate(Script(["x"]), ["square(2)"], VOCAB, "rm", Limits(max_new_tokens=30), library=PAPER.library)[0]
    assert g.reason == "more than 30 generated tokens" and g.n_generated == 31
    g = generate(Script(["x"], block_size=16), ["square(2)"], VOCAB, "rm", library=PAPER.library)[0]
    assert g.reason == "active frame of 17 tokens exceeds the model's block size 16"
    g = generate(Script(["x"], block_size=16), ["square(2)"], VOCAB, "cot", library=PAPER.library)[0]
    assert g.reason == "trace of 17 tokens exceeds the model's block size 16"
    # In RM a deep trace is fine as long as every frame fits: the frames here are short.
    ok = generate(Script(recurse * 8 + "x := 2 return <return> 4 </return>".split() +
                         ["x", ":=", "4", "return", "<return>", "6", "</return>"] * 8, block_size=16),
                  ["square(2)"], VOCAB, "rm", Limits(max_new_tokens=1000), library=PAPER.library)[0]  # far beyond square(2)'s own trace
    assert ok.valid and ok.max_depth == 9 and len(ok.tokens) > 16


def test_rm_training_variants_decode_as_rm_and_unknown_views_are_user_errors():
    g = generate(oracle_predictor("rm-frames", VOCAB, library=PAPER.library), [WORKED], VOCAB, "rm-frames", library=PAPER.library)[0]
    assert g.valid and g.answer == "1"
    with pytest.raises(ConfigError, match="unknown learner 'window'"):
        generate(Oracle(VOCAB, library=PAPER.library), [WORKED], VOCAB, "window", library=PAPER.library)


@pytest.mark.parametrize("factor", [None, 1, 3])
def test_the_default_cap_scales_with_each_expressions_canonical_trace(factor):
    from rlmlab.decoding.driver import RUNAWAY_SLACK

    limits = Limits() if factor is None else Limits(runaway_factor=factor)
    exprs = ["square(2)", "factorial(9,1)", "add(sum_of_squares(2,3),double(4))"]
    for learner in ("rm", "cot"):
        gens = generate(Script(["x"]), exprs, VOCAB, learner, limits, batch_size=1, library=PAPER.library)  # never closes its root
        for e, g in zip(exprs, gens):
            ex = PAPER.execute(e)
            cap = (factor or 8) * (ex.trace_len - ex.prompt_len) + RUNAWAY_SLACK
            assert g.reason == f"more than {cap} generated tokens" and g.n_generated == cap + 1


def test_any_runaway_factor_lets_a_right_trace_finish_and_a_bad_one_is_a_config_error():
    exprs = ["square(2)", "factorial(9,1)", "add(sum_of_squares(2,3),double(4))"]
    for learner in ("rm", "cot"):
        gens = generate(oracle_predictor(learner, VOCAB, library=PAPER.library), exprs, VOCAB, learner, Limits(runaway_factor=1), library=PAPER.library)
        assert all(g.valid and g.answer == str(PAPER.execute(e).value) for e, g in zip(exprs, gens))
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ConfigError, match="runaway_factor must be a positive integer"):
            Limits(runaway_factor=bad)

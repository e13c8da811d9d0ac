"""Observation functions: each is idempotent; its training examples are exactly the generic
construction from `observe`; its driver shows the predictor `observe(prefix)` at every step,
reproduces canonical traces with the oracle, and keeps KV caches exact."""

import pytest
import torch
from conftest import Recorder, sample_expressions

from rlmlab.decoding.driver import Limits, generate
from rlmlab.decoding.engine import ModelPredictor
from rlmlab.decoding.oracle import oracle_predictor
from rlmlab.decoding.predictor import TeacherForced
from rlmlab.errors import ConfigError
from rlmlab.learning.config import DataSettings
from rlmlab.learning.examples import build_examples, get_packing
from rlmlab.learning.learner import as_learner
from rlmlab.learning.learner import get_learner as learner
from rlmlab.learning.model import Transformer, preset
from rlmlab.learning.observe import (
    NEW,
    POP,
    PUSH,
    Reduce,
    Window,
    observer,
    reduce_calls,
    reference_examples,
)
from rlmlab.task.frames import active_frame
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

VOCAB = PAPER.vocab
WORKED = "add(sum_of_squares(2,3),double(4))"
NAMES = ["cot", "rm", "window:1", "window:7", "window:64", "reduce"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def executions():
    """180 random traces of at most 400 tokens (the O(n^2) references stay fast)."""
    exs = [PAPER.execute(e) for e in sample_expressions(400, 31)]
    return [ex for ex in exs if ex.trace_len <= 400][:180]


@pytest.mark.parametrize("name", NAMES)
def test_idempotent_on_traces_and_their_prefixes(name, executions):
    obs = observer(name)
    checked = 0
    for ex in executions:
        for t in range(ex.prompt_len, ex.trace_len + 1, 3):
            v = obs.observe(ex.tokens[:t], ex.prompt_len)
            assert obs.observe(v, min(ex.prompt_len, len(v))) == v
            checked += 1
    assert checked > 3000


@pytest.mark.parametrize("name", NAMES)
def test_examples_are_the_generic_construction_and_cover_every_point(name, executions):
    obs = observer(name)
    for ex in executions:
        got = obs.examples(ex.tokens, ex.prompt_len)
        assert got == reference_examples(obs, ex.tokens, ex.prompt_len)
        # Loss positions are exactly the prediction points of the canonical trace, in order:
        # target i of an example is predicted from observe(prefix) and is the trace's next token.
        targets = [toks[i] for toks, m in got for i in range(m, len(toks))]
        assert tuple(targets) == ex.tokens[ex.prompt_len:]
        t = ex.prompt_len
        for toks, m in got[:3]:
            for i in range(m, len(toks)):
                assert list(toks[:i]) == obs.observe(ex.tokens[:t], ex.prompt_len)
                t += 1


def test_training_views_of_observations_match_the_registered_packings(executions):
    for ex in executions[:60]:
        assert [(x.tokens, x.loss_positions[0]) for x in get_packing("rm-frames")(ex)] == \
            observer("rm").examples(ex.tokens, ex.prompt_len)
        assert [(x.tokens, x.loss_positions[0]) for x in get_packing("cot")(ex)] == \
            observer("cot").examples(ex.tokens, ex.prompt_len)
        for name in ("window:16", "reduce"):
            examples = get_packing(name)(ex)
            assert [(x.tokens, x.loss_positions[0]) for x in examples] == observer(name).examples(ex.tokens, ex.prompt_len)
            assert all(x.loss_positions == list(range(x.loss_positions[0], len(x.tokens))) for x in examples)


def test_reduction_by_hand_and_its_active_frame_is_pi_rec(executions):
    ex = PAPER.execute(WORKED)
    # After square(2) returned inside add(square(2),square(3)): its block is the value 4.
    t = ex.tokens.index("</return>") + 1
    assert " ".join(reduce_calls(ex.tokens[:t])) == (
        "add ( sum_of_squares ( 2 , 3 ) , double ( 4 ) ) x := <call> sum_of_squares ( 2 , 3 ) </call> "
        "a := 2 b := 3 return <return> <call> add ( square ( 2 ) , square ( 3 ) ) </call> x := 4")
    assert " ".join(reduce_calls(ex.tokens)) == ("add ( sum_of_squares ( 2 , 3 ) , double ( 4 ) ) x := 3 y := 8 "
                                                 "return <return> 1 </return>")
    for ex in executions[:80]:
        for t in range(ex.prompt_len, ex.trace_len + 1, 5):
            assert active_frame(reduce_calls(ex.tokens[:t])) == active_frame(ex.tokens[:t])


def test_window_examples_cost_k_tokens_per_target_once_the_window_slides():
    ex = PAPER.execute(WORKED)  # 100 tokens, 14 of them the written expression
    got = Window(20).examples(ex.tokens, ex.prompt_len)
    assert got[0] == (ex.tokens[:21], 14)  # points 14..20 read the whole prefix
    assert len(got) == 1 + (100 - 21) and all(len(toks) == 21 and m == 20 for toks, m in got[1:])
    # A window shorter than the written expression: every point has its own example.
    assert all(m == 5 for _, m in Window(5).examples(ex.tokens, ex.prompt_len))


# --- the driver ---------------------------------------------------------------------------

class Canonical:
    """Emits each row's canonical trace and checks what the driver shows it: at every step the
    observation is observe(trace so far), and the first `keep` tokens are the ones shown last
    step. Rows enter slots in input order (generate(..., longest_first=False))."""

    block_size = None

    def __init__(self, exprs, name):
        self.exs = [PAPER.execute(e) for e in exprs]
        self.obs = observer(name)
        self.checked = 0

    def reset(self, n_slots):
        self.next_row = 0
        self.row = [None] * n_slots
        self.shown = [None] * n_slots
        self.emitted = [0] * n_slots
        self.parked = [[] for _ in range(n_slots)]

    def __call__(self, feeds):
        out = []
        for f in feeds:
            if f.event == NEW:
                assert f.keep == 0
                self.row[f.slot], self.next_row = self.next_row, self.next_row + 1
                self.shown[f.slot], self.emitted[f.slot], self.parked[f.slot] = [], 0, []
            ex = self.exs[self.row[f.slot]]
            t = ex.prompt_len + self.emitted[f.slot]
            assert VOCAB.decode(f.seq) == self.obs.observe(ex.tokens[:t], ex.prompt_len)
            # keep counts from what was shown last, or on a pop from the parent as it was parked
            if f.event == PUSH:
                self.parked[f.slot].append(self.shown[f.slot])
            base = self.parked[f.slot].pop() if f.event == POP else self.shown[f.slot]
            assert f.seq[:f.keep] == base[:f.keep]
            self.shown[f.slot] = list(f.seq)
            self.emitted[f.slot] += 1
            self.checked += 1
            out.append(VOCAB.ids[ex.tokens[t]])
        return out


@pytest.mark.parametrize("name", NAMES)
def test_driver_shows_observe_of_the_trace_and_reproduces_it(name):
    exprs = [WORKED] + [e for e in sample_expressions(120, 32) if PAPER.execute(e).trace_len <= 600][:40]
    guide = Canonical(exprs, name)
    gens = generate(guide, exprs, VOCAB, name, batch_size=6, longest_first=False, library=PAPER.library)
    for g, ex in zip(gens, guide.exs):
        assert g.valid and tuple(g.tokens) == ex.tokens and g.answer == ex.value_token
    assert guide.checked == sum(ex.trace_len - ex.prompt_len for ex in guide.exs)


@pytest.mark.parametrize("name", ["reduce", "window:4096"])
def test_oracle_reproduces_canonical_traces_through_the_driver(name, random_exprs):
    gens = generate(oracle_predictor(name, VOCAB, library=PAPER.library), random_exprs[:300], VOCAB, name, batch_size=64, library=PAPER.library)
    for g, e in zip(gens, random_exprs[:300]):
        ex = PAPER.execute(e)
        assert g.valid and tuple(g.tokens) == ex.tokens


def _model(name, seed=0):
    torch.manual_seed(seed)
    return Transformer(preset("tiny", name, len(VOCAB))).eval()


@pytest.mark.parametrize("name", ["reduce", "window:24"])
def test_cached_logits_equal_recomputed_and_the_model_on_observe_alone(name):
    model = _model(name)
    exprs = [WORKED] + [e for e in sample_expressions(60, 33) if PAPER.execute(e).trace_len <= 200][:10]
    logs = []
    for use_cache in (True, False):
        rec = Recorder(ModelPredictor(model, use_cache=use_cache))
        guide = Canonical(exprs, name)
        gens = generate(TeacherForced(rec, guide), exprs, VOCAB, name, batch_size=4, longest_first=False, library=PAPER.library)
        assert all(g.valid for g in gens)
        logs.append(rec.log)
    worst = 0.0
    for (feeds_a, la), (feeds_b, lb) in zip(*logs):
        assert feeds_a == feeds_b
        worst = max(worst, (la - lb).abs().max().item())
    assert worst < 1e-4 and len(logs[0]) > 100
    # And the cached logits are the model run on the observation alone (spot checks).
    with torch.no_grad():
        for feeds, logits in logs[0][::17]:
            for k, (_, seq) in enumerate(feeds):
                alone = model(torch.tensor(seq)[None])[0, -1]
                assert (alone - logits[k]).abs().max().item() < 1e-4


def test_a_reduction_keeps_the_cache_prefix_on_return():
    guide = Canonical([WORKED], "reduce")
    keeps = []

    class Spy:
        block_size = None

        def reset(self, n):
            guide.reset(n)

        def __call__(self, feeds):
            keeps.append((feeds[0].keep, len(feeds[0].seq)))
            return guide(feeds)

    generate(Spy(), [WORKED], VOCAB, "reduce", batch_size=1, library=PAPER.library)
    # Never a fresh prefill after the first step: a return cuts back to where <call> stood.
    assert all(keep > 0 for keep, _ in keeps[1:])
    assert any(n - keep == 1 and n < prev for (keep, n), (_, prev) in zip(keeps[1:], keeps))


# --- names and parameters -----------------------------------------------------------------

def test_names_parameters_and_settings(tmp_path):
    assert learner("rm-frames").driver == observer("rm-frames").name == "rm" and learner("rm").driver == "rm"
    assert learner("window:256").driver == observer("window:256").name == "window:256"
    assert learner("reduce").driver == "reduce" and learner("cot").driver == "cot"
    # Resolved once: the same object for a name, labels and row lengths from the observation alone.
    assert learner("rm") is learner("rm") is as_learner(learner("rm")) and as_learner("cot") is learner("cot")
    assert [learner(v).label for v in ("rm", "cot", "rm-frames", "window:8")] == ["RM", "CoT", "rm-frames", "window:8"]
    assert [learner(v).row_length for v in ("rm", "rm-frames", "cot", "window:8", "reduce")] == [128, 128, 512, 512, 512]
    assert isinstance(observer("reduce"), Reduce) and observer("window:3").k == 3
    for bad in ("window", "window:0", "window:-3", "window:x", "window:08", "reduce:2", "stack"):
        with pytest.raises(ConfigError) as e:
            observer(bad)
        assert "\n" not in str(e.value) and repr(bad) in str(e.value)
        with pytest.raises(ConfigError, match="data.learner"):
            DataSettings(learner=bad)
    assert DataSettings(learner="window:256").learner == "window:256" and DataSettings(learner="reduce").row_length == 512
    with pytest.raises(ConfigError, match="rm-lanes"):
        get_packing("rm-lanes")
    # Block sizes: a window fits its preset's table (widened when needed); a reduction reads like CoT.
    assert preset("tiny", "window:1000", len(VOCAB)).block_size == 1000
    assert preset("tiny", "window:16", len(VOCAB)).block_size == preset("tiny", "rm", len(VOCAB)).block_size
    assert preset("small", "reduce", len(VOCAB)).block_size == preset("small", "cot", len(VOCAB)).block_size
    texts = ["add(sum_of_squares(2,3),double(4))", "square(double(3))"]
    for name in ("window:8", "reduce"):
        data = build_examples(texts, name, VOCAB, cache_dir=tmp_path, task=PAPER)
        assert data.learner == name and data.n_targets == sum(PAPER.execute(t).trace_len - PAPER.execute(t).prompt_len for t in texts)
        assert build_examples(texts, name, VOCAB, cache_dir=tmp_path, task=PAPER).n_tokens == data.n_tokens


def test_train_and_eval_cli_take_parameterised_views(tmp_path, capsys):
    from rlmlab.cli import main

    f = tmp_path / "e.txt"
    f.write_text("add(sum_of_squares(2,3),double(4))\nsquare(double(3))\n")
    assert main(["eval", "--oracle", "reduce", "--data", str(f), "--out", str(tmp_path / "o"),
                 "--quiet", "--no-per-token"]) == 0
    assert "accuracy  100.00%" in capsys.readouterr().out
    assert main(["eval", "--oracle", "window:0", "--data", str(f), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "window:0" in err
    assert main(["train", "--learner", "window:zero", "--data", str(f), "--out", str(tmp_path / "r"),
                 "--max-steps", "1"]) == 2
    assert "data.learner" in capsys.readouterr().err


def test_generation_limits_still_apply_with_windows():
    g = generate(oracle_predictor("window:4", VOCAB, library=PAPER.library), [WORKED], VOCAB, "window:4", Limits(max_new_tokens=50), library=PAPER.library)[0]
    assert not g.valid and g.reason  # g* o Pi_rec of four tokens is not the true rule

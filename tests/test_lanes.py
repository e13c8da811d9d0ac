"""Lane packing is exact: one pass over a trace's lanes equals every active-frame example run alone."""

import torch
from conftest import sample_expressions

from rlmlab.attention.backends import Dense
from rlmlab.attention.layout import Layout
from rlmlab.learning.lanes import IGNORE, lane_pack
from rlmlab.learning.model import Transformer, preset
from rlmlab.measuring.simulate import lane_tensors, simulate_rm
from rlmlab.task.frames import active_frame
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

VOCAB = PAPER.vocab


def _model(seed=0):
    torch.manual_seed(seed)
    return Transformer(preset("tiny", "rm", len(VOCAB))).eval()


def _traces(n, seed):
    exs = [PAPER.execute("add(sum_of_squares(2,3),double(4))"), PAPER.execute("fibonacci(9,accum_sum(9,3),factorial(9,1))")]
    return exs + [PAPER.execute(e) for e in sample_expressions(n, seed)]


def test_lane_targets_are_the_frame_examples_targets():
    for ex in _traces(300, 11):
        lanes = lane_pack(ex.tokens, ex.prompt_len)
        assert len(lanes.example_targets) == ex.n_frame_examples
        for f, lane_idx in zip(ex.frames, lanes.example_targets):
            assert tuple(lanes.tokens[i] for i in lane_idx) == f.targets
            assert tuple(lanes.labels[i - 1] for i in lane_idx) == f.targets
        assert sum(lab is not None for lab in lanes.labels) == sum(len(f.targets) for f in ex.frames)


def test_lane_logits_equal_per_frame_logits_and_loss():
    model = _model()
    worst = 0.0
    for ex in _traces(40, 12):
        lanes = lane_pack(ex.tokens, ex.prompt_len)
        idx, pos, labels = lane_tensors(lanes, VOCAB)
        with torch.no_grad():
            packed = model(idx[None], pos[None], Dense(Layout.of_lanes(lanes.frame, lanes.branch)))[0]
        packed_loss = torch.nn.functional.cross_entropy(packed, labels, ignore_index=IGNORE, reduction="sum")
        alone_loss = 0.0
        for f, lane_idx in zip(ex.frames, lanes.example_targets):
            with torch.no_grad():
                alone = model(torch.tensor(VOCAB.encode(f.tokens))[None])[0]
            rows = torch.tensor([f.m + k - 1 for k in range(len(f.targets))])
            worst = max(worst, (packed[torch.tensor(lane_idx) - 1] - alone[rows]).abs().max().item())
            alone_loss += torch.nn.functional.cross_entropy(
                alone[rows], torch.tensor(VOCAB.encode(f.targets)), reduction="sum").item()
        assert abs(packed_loss.item() - alone_loss) <= 1e-3 * max(1.0, alone_loss)
    assert worst <= 1e-4


def test_lane_tokens_are_about_1_5x_the_cot_trace():
    lane = cot = frames = 0
    for ex in _traces(300, 13):
        lane += len(lane_pack(ex.tokens, ex.prompt_len))
        cot += ex.trace_len
        frames += sum(f.width for f in ex.frames)
    assert lane / cot < 1.6 < 2.3 < frames / cot


def test_simulator_equals_rm_on_the_active_frame_of_every_prefix():
    model = _model(1)
    for ex in _traces(6, 14):
        got = simulate_rm(model, VOCAB, ex.tokens, ex.prompt_len)
        assert len(got) == ex.trace_len - ex.prompt_len + 1
        for t in range(ex.prompt_len, ex.trace_len + 1):
            frame = active_frame(ex.tokens[:t])
            with torch.no_grad():
                logits = model(torch.tensor(VOCAB.encode(frame))[None])[0, -1]
            assert got[t - ex.prompt_len] == VOCAB.tokens[int(logits.argmax())]


def test_simulator_on_a_prefix_that_stops_inside_a_call_block():
    model = _model(2)
    ex = PAPER.execute("add(sum_of_squares(2,3),double(4))")
    cut = ex.tokens.index("square") + 2  # ... <call> add ( square (
    got = simulate_rm(model, VOCAB, ex.tokens[:cut], ex.prompt_len)
    with torch.no_grad():
        ref = model(torch.tensor(VOCAB.encode(active_frame(ex.tokens[:cut])))[None])[0, -1].argmax()
    assert got[-1] == VOCAB.tokens[int(ref)]

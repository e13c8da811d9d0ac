"""The shared Transformer: parameter count of the paper preset, masks and positions, and the
block-diagonal attention path against the dense mask."""

import pytest
import torch
import torch.nn.functional as F
from conftest import draw_packed_layout
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmlab.attention.backends import Blocks, Dense
from rlmlab.attention.layout import Layout
from rlmlab.learning.model import Transformer, preset
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def test_paper_preset_parameter_count():
    V = len(PAPER.vocab)
    m = Transformer(preset("paper", "rm", V))
    # Counted like the paper (~10.65M): distinct weights, tied embedding once, positional table excluded.
    assert 10.6e6 < m.num_params(include_positions=False) < 10.7e6
    assert m.num_params() - m.num_params(include_positions=False) == 2048 * 384


def test_explicit_causal_mask_equals_is_causal():
    torch.manual_seed(0)
    m = Transformer(preset("tiny", "rm", 59)).eval()
    x = torch.randint(0, 59, (3, 17))
    mask = torch.ones(17, 17, dtype=torch.bool).tril().expand(3, 1, 17, 17)
    torch.testing.assert_close(m(x), m(x, attn=Dense.from_mask(mask)), atol=1e-5, rtol=0)


def _dense_block_mask(B, T, row, start, length, frame=None, branch=None):
    """The (B, 1, T, T) mask a packed `Layout` stands for, built position by position."""
    mask = torch.zeros(B, T, T, dtype=torch.bool)
    for r, s, n in zip(row.tolist(), start.tolist(), length.tolist()):
        for i in range(n):
            for j in range(i + 1):
                ok = frame is None or (frame[r, s + i] == frame[r, s + j]
                                       and (branch[r, s + j] == -1 or branch[r, s + i] == branch[r, s + j]))
                mask[r, s + i, s + j] = bool(ok)
    return mask.unsqueeze(1)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_the_layout_mask_is_the_mask_built_position_by_position(data):
    """`Layout.mask`, the rule every backend applies, over random packed layouts with and without
    lanes: at example positions it is the reference mask; no example sees padding or padding an
    example, and no query row is empty."""
    B, T, row, start, length = draw_packed_layout(data, 40)
    frame = branch = None
    if data.draw(st.booleans()):
        frame = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=B * T, max_size=B * T))).view(B, T)
        branch = torch.tensor(data.draw(st.lists(st.integers(-1, 1), min_size=B * T, max_size=B * T))).view(B, T)
    mask = Layout.packed(B, T, row, start, length, frame, branch).mask()[:, 0]
    ref = _dense_block_mask(B, T, row, start, length, frame, branch)[:, 0]
    inside = ref.any(-1)  # (B, T) positions of some example
    assert torch.equal(mask[inside], ref[inside])
    assert not (mask & (inside[:, :, None] != inside[:, None, :])).any()
    assert mask.any(-1).all()


# CUDA joins where a GPU is present (training uses this path there too); CPU always runs.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_block_diagonal_attention_equals_the_dense_mask(device, data):
    """Random packed layouts (one to a few rows, blocks of any length, row padding), with and
    without lane structure, pieces small enough that long blocks are cut many times: outputs
    at block positions and all input gradients equal those of the dense mask."""
    B, T, row, start, length = draw_packed_layout(data, 40)
    lanes = data.draw(st.booleans())
    frame = branch = None
    if lanes:
        frame = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=B * T, max_size=B * T))).view(B, T)
        branch = torch.tensor(data.draw(st.lists(st.integers(-1, 1), min_size=B * T, max_size=B * T))).view(B, T)
        # a query always sees itself (the dense mask of a real batch never has an empty row)
    chunk, max_pieces = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 5))
    dense = _dense_block_mask(B, T, row, start, length, frame, branch)
    on = (lambda t: None if t is None else t.to(device))
    blocks = Blocks(Layout.packed(B, T, on(row), on(start), on(length), on(frame), on(branch)), chunk=chunk,
                    max_pieces=max_pieces)
    inside = dense[:, 0].any(-1).to(device)  # (B, T) positions in some block
    dense = dense.to(device) | ~inside[:, None, :, None]  # outside positions: any non-empty row (output unused)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, 2, T, 4, device=device, requires_grad=True) for _ in range(3))
    g = torch.randn(B, 2, T, 4, device=device) * inside[:, None, :, None]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    out = blocks.attend(q, k, v)
    keep = inside[:, None, :, None]
    torch.testing.assert_close(out * keep, ref * keep, atol=1e-5, rtol=1e-5)
    assert torch.equal(out * ~keep, torch.zeros_like(out))
    for a, b in zip(torch.autograd.grad((out * g).sum(), (q, k, v)), torch.autograd.grad((ref * g).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

"""Packing: every example once, little padding, and a packed row computes what the examples compute alone."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlmlab.learning.examples import build_examples
from rlmlab.learning.model import Transformer, preset
from rlmlab.learning.packing import (
    IGNORE,
    Row,
    RowStream,
    collate,
    micro_batches,
    pack_rows,
    padding_fraction,
    row_length_for,
)
from rlmlab.task.expr import to_text
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def _data(random_exprs, learner, n=300):
    return build_examples([to_text(e) for e in random_exprs[:n]], learner, PAPER.vocab, task=PAPER)


def test_long_examples_get_rows_of_their_own():
    assert [row_length_for(n, 128) for n in (1, 128, 129, 192, 193, 1000)] == [128, 128, 192, 192, 256, 1024]
    rows = pack_rows(np.array([100, 300, 20, 8, 1000]), 128)
    assert [(r.length, r.examples) for r in rows] == [(128, (0, 2, 3)), (320, (1,)), (1024, (4,))]


def test_every_example_once_and_padding_under_10_percent(random_exprs):
    for learner, row_len in (("rm-frames", 256), ("rm-frames", 512), ("rm", 512), ("cot", 512)):
        data = _data(random_exprs, learner)
        lengths = data.lengths - 1
        order = np.random.default_rng(0).permutation(len(lengths))
        rows = pack_rows(lengths, row_len, order)
        placed = sorted(e for r in rows for e in r.examples)
        assert placed == list(range(len(lengths)))
        assert all(lengths[list(r.examples)].sum() <= r.length for r in rows)
        assert all(r.length == row_length_for(int(lengths[r.examples[0]]), row_len) for r in rows)
        assert all(len(r.examples) == 1 for r in rows if r.length > row_len)
        assert padding_fraction(rows, lengths) < 0.10, (learner, row_len)


def test_collate_layout_and_block_diagonal_mask(random_exprs):
    data = _data(random_exprs, "rm-frames", 60)
    rows = [r for r in pack_rows(data.lengths - 1, 128) if len(r.examples) > 2][:3]
    b = collate(data.ids, data.loss, data.offsets, rows, pad_id=0)
    mask = b.attention("dense").mask
    assert mask.shape == (3, 1, 128, 128) and mask[:, 0].any(-1).all()  # no query row sees nothing
    for r, row in enumerate(rows):
        t = 0
        for e in row.examples:
            ids, loss = data.example(e)
            n = len(ids) - 1
            sl = slice(t, t + n)
            assert b.idx[r, sl].tolist() == ids[:-1].tolist()
            assert b.pos[r, sl].tolist() == list(range(n))
            assert b.targets[r, sl].tolist() == [int(i) if f else IGNORE for i, f in zip(ids[1:], loss[1:])]
            assert (b.doc[r, sl] == e).all()
            t += n
        assert (b.doc[r, t:] == -1).all() and (b.targets[r, t:] == IGNORE).all()
        same = b.doc[r][:, None] == b.doc[r][None, :]
        allowed = same & torch.ones(128, 128, dtype=torch.bool).tril()
        assert torch.equal(mask[r, 0], allowed)
        real = b.doc[r] >= 0
        # an example position never attends to another example or to padding
        assert not (mask[r, 0][real] & ~same[real]).any()
    assert b.n_targets == int((b.targets != IGNORE).sum())


def _one_by_one(model, data, examples):
    total, n = 0.0, 0
    logits_of = {}
    for e in examples:
        ids, loss = data.example(e)
        x = torch.from_numpy(ids[:-1].astype(np.int64))[None]
        y = torch.from_numpy(np.where(loss[1:], ids[1:].astype(np.int64), IGNORE))[None]
        logits = model(x)  # plain causal attention, positions 0..n-2
        logits_of[e] = logits[0]
        total += float(F.cross_entropy(logits[0], y[0], ignore_index=IGNORE, reduction="sum"))
        n += int((y != IGNORE).sum())
    return total / n, logits_of


@pytest.mark.parametrize("fast", [False, True], ids=["dense-mask", "block-attention"])
def test_packed_loss_equals_one_by_one_loss(random_exprs, fast):
    """Either form of the packed rows' mask: the dense one, and the one training uses
    (`PackedBatch.attention`: blocks beyond 128 positions, long traces included)."""
    torch.manual_seed(0)
    for learner in ("rm-frames", "cot"):
        data = _data(random_exprs, learner, 40)
        data = data.select(data.lengths - 1 <= 1024)
        model = Transformer(preset("tiny", "cot", len(data.vocab))).eval()
        rows = pack_rows(data.lengths - 1, 256 if fast else 64)  # long CoT traces get rows of their own
        packed_sum, n = 0.0, 0
        packed_logits = {}
        with torch.no_grad():
            for mb in micro_batches(rows, 4096):
                b = collate(data.ids, data.loss, data.offsets, mb, data.vocab.pad_id)
                logits = model(b.idx, pos=b.pos, attn=b.attention() if fast else b.attention("dense"))
                packed_sum += float(F.cross_entropy(logits.view(-1, logits.size(-1)), b.targets.view(-1),
                                                    ignore_index=IGNORE, reduction="sum"))
                n += b.n_targets
                for e in set(b.doc.view(-1).tolist()) - {-1}:
                    packed_logits[e] = logits[b.doc == e]
            alone, alone_logits = _one_by_one(model, data, range(len(data)))
        assert n == data.n_targets
        assert abs(packed_sum / n - alone) < 1e-6 * alone
        for e, lg in alone_logits.items():
            torch.testing.assert_close(packed_logits[e], lg, atol=1e-5, rtol=1e-5)


def test_single_example_rows_use_the_plain_causal_path(random_exprs):
    data = _data(random_exprs, "cot", 5)
    rows = [Row(512, (i,)) for i in range(len(data)) if data.lengths[i] - 1 <= 512]
    b = collate(data.ids, data.loss, data.offsets, rows, data.vocab.pad_id)
    assert b.one_per_row and b.attention("dense").mask is None


def test_micro_batches_group_by_length_within_the_token_cap():
    rows = [Row(128, (0,)), Row(256, (1,)), Row(128, (2,)), Row(128, (3,)), Row(512, (4,))]
    groups = micro_batches(rows, 256)
    assert [[r.examples[0] for r in g] for g in groups] == [[0, 2], [3], [1], [4]]


def test_row_stream_is_seeded_and_resumable():
    lengths = np.random.default_rng(1).integers(1, 60, size=500)
    a = RowStream(lengths, 128, seed=3)
    first = [a.take(1000) for _ in range(40)]  # several epochs
    b = RowStream(lengths, 128, seed=3)
    for _ in range(17):
        b.take(1000)
    c = RowStream(lengths, 128, seed=3)
    c.load_state(b.state())
    assert [c.take(1000) for _ in range(23)] == first[17:]
    epoch0 = sorted(e for r in a.epoch_rows(0) for e in r.examples)
    assert epoch0 == list(range(500)) and a.epoch_rows(0) != a.epoch_rows(1)
    assert RowStream(lengths, 128, seed=4).epoch_rows(0) != a.epoch_rows(0)


def _step_loss_and_grads(model, data, row_len, fast=False):
    """Mean target loss over every example of `data` packed into rows, and its gradients."""
    model.zero_grad()
    total, n = 0.0, 0
    rows = pack_rows(data.lengths - 1, row_len)
    for mb in micro_batches(rows, 8192):
        b = collate(data.ids, data.loss, data.offsets, mb, data.vocab.pad_id, data.layout)
        logits = model(b.idx, pos=b.pos, attn=b.attention() if fast else b.attention("dense"))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), b.targets.view(-1), ignore_index=IGNORE,
                               reduction="sum")
        loss.backward()
        total += float(loss.detach())
        n += b.n_targets
    grads = torch.cat([p.grad.flatten() / n for p in model.parameters()])
    return total / n, n, grads


@pytest.mark.parametrize("fast", [False, True], ids=["dense-mask", "block-attention"])
def test_lane_packed_rm_equals_per_frame_rm_loss_and_update(random_exprs, fast):
    """Lane packing (the default RM packing) is the per-frame RM objective exactly: same targets,
    same mean loss, same gradient, so one optimizer step from the same weights is the same;
    with the lanes' block attention (rows of 512) as with their dense mask."""
    torch.manual_seed(0)
    texts = [to_text(e) for e in random_exprs[:60]]
    lanes = build_examples(texts, "rm", PAPER.vocab, task=PAPER)
    frames = build_examples(texts, "rm-frames", PAPER.vocab, task=PAPER)
    assert lanes.n_targets == frames.n_targets and lanes.n_tokens < 0.7 * frames.n_tokens
    model = Transformer(preset("tiny", "rm", len(lanes.vocab)))
    loss_l, n_l, grad_l = _step_loss_and_grads(model, lanes, 512, fast)
    loss_f, n_f, grad_f = _step_loss_and_grads(model, frames, 128)
    assert n_l == n_f
    assert abs(loss_l - loss_f) < 1e-5 * loss_f
    torch.testing.assert_close(grad_l, grad_f, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("learner", ["cot", "rm"])
def test_start_offsets_move_positions_only_and_stay_in_the_table(random_exprs, learner):
    data = _data(random_exprs, learner, 80)
    lengths = data.lengths - 1
    rows = [r for r in pack_rows(lengths, 512) if r.length == 512][:4]
    block = 600
    plain = collate(data.ids, data.loss, data.offsets, rows, 0, data.layout, block)
    draws = [collate(data.ids, data.loss, data.offsets, rows, 0, data.layout, block,
                     np.random.default_rng(seed), max_shift=block) for seed in (1, 1, 2)]
    for b in draws:  # same tokens, targets, examples and mask; positions shifted per example
        assert torch.equal(b.idx, plain.idx) and torch.equal(b.targets, plain.targets)
        assert torch.equal(b.doc, plain.doc) and torch.equal(b.attention("dense").mask, plain.attention("dense").mask)
        assert int(b.pos.max()) < block
        for e in b.doc.unique().tolist():
            if e < 0:
                continue
            at = b.doc == e
            shift = (b.pos[at] - plain.pos[at]).unique()
            assert len(shift) == 1 and int(shift) >= 0  # one offset for the whole example
    assert torch.equal(draws[0].pos, draws[1].pos) and not torch.equal(draws[0].pos, draws[2].pos)
    assert not torch.equal(draws[0].pos, plain.pos)
    # A bound of N never starts an example beyond N; room-limited examples stay inside the table.
    capped = collate(data.ids, data.loss, data.offsets, rows, 0, data.layout, block, np.random.default_rng(3), 5)
    assert int((capped.pos - plain.pos).max()) <= 5
    tight = collate(data.ids, data.loss, data.offsets, rows, 0, data.layout, int(plain.pos.max()) + 1,
                    np.random.default_rng(4), max_shift=10_000)
    assert torch.equal(tight.pos[plain.pos == int(plain.pos.max())], plain.pos[plain.pos == int(plain.pos.max())])

"""Attention masks other than plain causal, all in one place: the block-diagonal mask of packed
training rows, the lane masks of lane-packed active-frame examples (`rlmlab.learning.lanes`):
a query sees only keys of its own frame that are on the frame's trunk or on its own pending
call block, and the layout of a decoding step over a KV cache (`CacheLayout`).

A packed batch's mask comes in two forms, each built on the host from the batch's example
layout and moved to the device once (`.to(device)`), so that attention asks the device nothing:
- `BlockDiagonal` (the CPU path): the mask kept as its blocks, attention run per group of
  example pieces with `scaled_dot_product_attention`;
- `FlexMask` (the CUDA path): one FlexAttention call per layer over the whole batch, the mask a
  `BlockMask` whose block tables say which 128 x 128 tiles hold any allowed pair (and which hold
  only allowed pairs), with the exact rule (same example, causal, lanes) as its `mask_mod`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from rlmlab.learning.lanes import IGNORE, Lanes, lane_pack
from rlmlab.task.vocab import Vocab


def lane_visible(frame_q: torch.Tensor, branch_q: torch.Tensor, frame_k: torch.Tensor,
                 branch_k: torch.Tensor) -> torch.Tensor:
    """Whether queries (..., Tq) may see keys (..., Tk) of lane-packed examples, causality
    aside: same frame, and a key on the trunk or on the query's own call block. (..., Tq, Tk)"""
    same_frame = frame_q.unsqueeze(-1) == frame_k.unsqueeze(-2)
    return same_frame & ((branch_k.unsqueeze(-2) == -1) | (branch_q.unsqueeze(-1) == branch_k.unsqueeze(-2)))


def lane_mask(frame: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """Mask from per-token frame and branch ids (any leading batch dims): (..., T, T)."""
    T = frame.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=frame.device).tril()
    return causal & lane_visible(frame, branch, frame, branch)


def lane_attention_mask(lanes: Lanes) -> torch.Tensor:
    """(T, T) bool, True = may attend."""
    return lane_mask(torch.tensor(lanes.frame), torch.tensor(lanes.branch))


def lane_tensors(lanes: Lanes, vocab: Vocab) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(idx, pos, labels) of a lane sequence as 1-D tensors; labels use IGNORE where there is no target."""
    idx = torch.tensor(vocab.encode(lanes.tokens))
    pos = torch.tensor(lanes.pos)
    ids = vocab.ids
    labels = torch.tensor([IGNORE if t is None else ids[t] for t in lanes.labels])
    return idx, pos, labels


def canonical(a: np.ndarray) -> torch.Tensor:
    """`a` as a tensor with the row-major strides of its shape, size-1 dimensions included.

    The compiled FlexAttention kernels index the block tables as if they had those strides.
    numpy gives a sum over a broadcast mask column-major strides and an inserted axis a stride
    of 0; with them the CPU kernel read other tiles' counts, and the CUDA kernel of an H200 read
    the first batch row's tables for every row (docs/gpu.md)."""
    return torch.from_numpy(np.asarray(a)).clone(memory_format=torch.contiguous_format)


def to_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """A host tensor on `device`; to CUDA from pinned memory without blocking the host (the copy
    is ordered before any kernel that reads it on the same stream)."""
    if t is None or t.device == device:
        return t
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _bucket_length(n: torch.Tensor) -> torch.Tensor:
    """Padded length of a block of n positions: few distinct lengths (few kernel calls) for
    at most ~12% of padding beyond 32 positions."""
    step = torch.where(n <= 128, 16, torch.where(n <= 256, 32, 64))
    return (n + step - 1) // step * step


class BlockDiagonal:
    """A block-diagonal attention mask over packed rows, kept as its blocks.

    Block i is one example: `length[i]` positions from `start[i]` in row `row[i]`, attending
    causally within itself; for lane-packed examples (`frame`, `branch` given, as in
    `rlmlab.learning.packing.PackedBatch`) a query further sees only keys of its own frame that are on
    the trunk or on its own call block.

    Why not a dense (B, 1, T, T) mask: the CPU attention kernel computes (and differentiates)
    every pair of a row whatever the mask says, and does not skip the upper triangle even for
    `is_causal`. So `attend` cuts each block into pieces of `chunk` queries (fewer, longer
    pieces for blocks longer than `max_pieces` chunks: short query pieces against long key
    ranges run the kernel far below its best rate), each with the keys up to its last query,
    gathers the pieces into batches of one padded shape and attends those. A block of n
    positions then costs about n^2/2 + n*max(chunk, n/max_pieces)/2 pairs instead of its
    row's T^2. Padded slots repeat a real position, and the mask keeps them from every real
    query. Positions outside every block (row padding) output zeros.
    """

    def __init__(self, B: int, T: int, row: torch.Tensor, start: torch.Tensor, length: torch.Tensor,
                 frame: torch.Tensor | None = None, branch: torch.Tensor | None = None, chunk: int = 128,
                 max_pieces: int = 4):
        dev = row.device
        piece = torch.clamp((length + max_pieces - 1) // max_pieces, min=chunk)
        piece = (piece + 15) // 16 * 16  # queries per piece, per block
        pieces = (length + piece - 1) // piece
        block = torch.repeat_interleave(torch.arange(len(length), device=dev), pieces)  # block of each piece
        first_piece = torch.cumsum(pieces, 0) - pieces
        q_start = (torch.arange(len(block), device=dev) - first_piece[block]) * piece[block]
        n_k = torch.minimum(q_start + piece[block], length[block])  # keys: the block up to the piece's last query
        n_q = n_k - q_start
        first = row[block] * T + start[block]  # flat index of the block's first position
        pad_q, pad_k = _bucket_length(n_q), _bucket_length(n_k)
        scatter = torch.full((B * T,), -1, dtype=torch.long, device=dev)
        self.groups: list[tuple[int, int, int, torch.Tensor | None]] = []  # pieces, query / key length, mask
        q_parts, k_parts = [], []
        offset = 0
        for Lq, Lk in sorted(set(zip(pad_q.tolist(), pad_k.tolist()))):
            sel = ((pad_q == Lq) & (pad_k == Lk)).nonzero().squeeze(1)
            E = len(sel)
            i, t = torch.arange(Lq, device=dev), torch.arange(Lk, device=dev)
            qs, nq, nk, f0 = q_start[sel, None], n_q[sel, None], n_k[sel, None], first[sel, None]
            q_index = f0 + qs + torch.minimum(i, nq - 1)  # (E, Lq)
            k_index = f0 + torch.minimum(t, nk - 1)  # (E, Lk)
            real = i < nq
            scatter[(f0 + qs + i)[real]] = offset + (torch.arange(E, device=dev)[:, None] * Lq + i)[real]
            mask = None
            if frame is not None or Lq != Lk or bool((qs > 0).any()):
                mask = t[None, None, :] <= (qs + i)[:, :, None]  # (E, Lq, Lk) causal, aligned to the piece
                if frame is not None:
                    f, b = frame.reshape(-1), branch.reshape(-1)
                    mask &= lane_visible(f[q_index], b[q_index], f[k_index], b[k_index])
                mask = mask.unsqueeze(1)  # (E, 1, Lq, Lk)
            self.groups.append((E, Lq, Lk, mask))
            q_parts.append(q_index.reshape(-1))
            k_parts.append(k_index.reshape(-1))
            offset += E * Lq
        # One gather per tensor for all groups: the backward of each gather allocates (and
        # zero-fills) a gradient the size of the whole batch, so per-group gathers would cost
        # more than the attention they feed.
        self.q_index, self.k_index = torch.cat(q_parts), torch.cat(k_parts)
        self.scatter = torch.where(scatter < 0, offset, scatter)  # `offset` = the zero row appended in attend
        self.shape = (B, T)

    def to(self, device) -> "BlockDiagonal":
        """This mask on `device` (itself when already there): built on the host, moved once."""
        device = torch.device(device)
        if self.q_index.device == device:
            return self
        out = object.__new__(BlockDiagonal)
        out.groups = [(E, Lq, Lk, to_device(mask, device)) for E, Lq, Lk, mask in self.groups]
        out.q_index, out.k_index, out.scatter = (to_device(t, device) for t in (self.q_index, self.k_index,
                                                                                self.scatter))
        out.shape = self.shape
        return out

    def attend(self, q, k, v, dropout_p: float = 0.0) -> torch.Tensor:
        """q, k, v (B, nh, T, hs) -> attention output (B, nh, T, hs)."""
        B, nh, T, hs = q.shape
        q, k, v = (t.transpose(1, 2).reshape(B * T, nh, hs) for t in (q, k, v))
        qs = q.index_select(0, self.q_index).split([E * Lq for E, Lq, _, _ in self.groups])
        ks = k.index_select(0, self.k_index).split([E * Lk for E, _, Lk, _ in self.groups])
        vs = v.index_select(0, self.k_index).split([E * Lk for E, _, Lk, _ in self.groups])
        outs = []
        for (E, Lq, Lk, mask), qb, kb, vb in zip(self.groups, qs, ks, vs):
            qb = qb.view(E, Lq, nh, hs).transpose(1, 2)  # (E, nh, Lq, hs)
            kb, vb = (t.view(E, Lk, nh, hs).transpose(1, 2) for t in (kb, vb))  # (E, nh, Lk, hs)
            y = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=mask is None,
                                               dropout_p=dropout_p)
            outs.append(y.transpose(1, 2).reshape(E * Lq, nh, hs))
        outs.append(q.new_zeros(1, nh, hs))
        y = torch.cat(outs).index_select(0, self.scatter)  # (B * T, nh, hs)
        return y.view(B, T, nh, hs).transpose(1, 2)


FLEX_BLOCK = 128  # FlexAttention's tile: the block tables say which tiles to compute


class FlexMask:
    """The mask of packed rows for FlexAttention: one attention call per layer for the whole batch.

    Same layout as `BlockDiagonal` (block i = `length[i]` positions from `start[i]` of row
    `row[i]`, causal within itself, lane rule from `frame` and `branch` when given). Positions
    outside every block (row padding) attend causally among themselves, so no query row is
    empty; their outputs are never read.

    The block tables are built here, on the host, from the layout alone. An example occupies a
    contiguous span, so the key tiles a query tile needs run from the tile holding the start of
    its first position's example up to the diagonal; a tile strictly below the diagonal whose
    keys and queries all lie in one example (and no lane rule applies) is full: the kernel skips
    the mask there.
    """

    def __init__(self, B: int, T: int, row: torch.Tensor, start: torch.Tensor, length: torch.Tensor,
                 frame: torch.Tensor | None = None, branch: torch.Tensor | None = None, block: int = FLEX_BLOCK):
        from torch.nn.attention.flex_attention import BlockMask

        row, start, length = (np.asarray(t.cpu()) for t in (row, start, length))
        seg = np.full((B, T), -1, dtype=np.int32)  # example ordinal per position, -1 = row padding
        within = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
        seg[np.repeat(row, length), np.repeat(start, length) + within] = np.repeat(np.arange(len(row)), length)
        t = np.arange(T)
        opens = np.ones((B, T), dtype=bool)
        opens[:, 1:] = seg[:, 1:] != seg[:, :-1]
        run_start = np.maximum.accumulate(np.where(opens, t, 0), axis=1)  # (B, T) start of each position's span
        nb = -(-T // block)
        first = run_start[:, ::block]  # (B, nb) span start of each query tile's first position
        last = run_start[:, np.minimum(np.arange(nb) * block + block - 1, T - 1)]  # ... of its last position
        i, j = np.arange(nb)[:, None], np.arange(nb)[None, :]
        lo = (first // block)[:, :, None]  # first key tile needed
        full_from = np.minimum(-(-last // block), np.arange(nb))[:, :, None]  # first tile wholly in the span
        if frame is not None:
            full_from = np.broadcast_to(i, full_from.shape)  # the lane rule: no tile is known full
        partial = ((j >= lo) & (j < full_from)) | (j == i)  # (B, nb, nb)
        full = (j >= full_from) & (j < i)

        def ordered(m: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            count = m.sum(-1).astype(np.int32)[:, None]
            index = np.argsort(~m, axis=-1, kind="stable").astype(np.int32)[:, None]  # allowed tiles first
            return canonical(count), canonical(index)

        self.tables = BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=block,
                                               seq_lengths=(T, T))
        self.seg = torch.from_numpy(seg)
        self.frame = None if frame is None else frame.to(torch.int32)
        self.branch = None if branch is None else branch.to(torch.int32)

    def to(self, device) -> "FlexMask":
        """This mask on `device`: its tables and ids moved once (from pinned memory on CUDA)."""
        device = torch.device(device)
        if self.seg.device == device:
            return self
        from torch.nn.attention.flex_attention import BlockMask

        out = object.__new__(FlexMask)
        tb = self.tables
        out.tables = BlockMask(seq_lengths=tb.seq_lengths, BLOCK_SIZE=tb.BLOCK_SIZE, mask_mod=tb.mask_mod,
                               **{a: to_device(getattr(tb, a), device) for a in BlockMask._TENSOR_ATTRS})
        out.seg, out.frame, out.branch = (to_device(t, device) for t in (self.seg, self.frame, self.branch))
        return out

    def block_mask(self):
        """The `BlockMask` of this batch: the block tables, and the exact rule per pair."""
        seg, frame, branch = self.seg, self.frame, self.branch
        if frame is None:
            def mask_mod(b, h, q, k):
                return (seg[b, q] == seg[b, k]) & (q >= k)
        else:
            def mask_mod(b, h, q, k):
                bk = branch[b, k]
                return ((seg[b, q] == seg[b, k]) & (q >= k) & (frame[b, q] == frame[b, k])
                        & ((bk == -1) | (branch[b, q] == bk)))
        tb = self.tables
        return type(tb)(seq_lengths=tb.seq_lengths, BLOCK_SIZE=tb.BLOCK_SIZE, mask_mod=mask_mod,
                        **{a: getattr(tb, a) for a in tb._TENSOR_ATTRS})


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask) -> torch.Tensor:
    """FlexAttention over (B, nh, T, hs). Outside a compiled model it runs through a compiled
    kernel of its own: the eager form materialises every score."""
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling() or q.device.type != "cuda":
        return flex_attention(q, k, v, block_mask=block_mask)
    return _compiled_flex()(q, k, v, block_mask=block_mask)


_COMPILED_FLEX = []


def _compiled_flex():
    if not _COMPILED_FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _COMPILED_FLEX[0]


class Group(NamedTuple):
    """A span of a decoding step's flat token row that attends as a batch of its own: `rows` rows
    of `T` tokens each (row-major). With `read` = hi the queries attend over positions [0, hi)
    of their slots' cached frames (`slots` (rows,), or None for slots 0..rows-1 read as views),
    stored first; with `read` None the rows are packed new frames attending only among
    themselves. mask (rows, 1, T, hi or T): bool, True = may attend, or ALiBi's float bias."""

    rows: int
    T: int
    read: int | None
    slots: torch.Tensor | None
    mask: torch.Tensor


class CacheLayout:
    """The mask of one decoding step over a KV cache (`rlmlab.decoding.cache.KVCache`).

    A step feeds every new token as one flat row (batch 1): token i's key and value are stored
    at position `at[i]` of slot `slots[i]`, and the row splits into `groups` (`Group`), each one
    attention call. One row with the groups cut out of it, rather than a batch padded to its
    longest member, lets single decoded tokens and whole new frames share one forward.
    """

    def __init__(self, slots: torch.Tensor, at: torch.Tensor, groups: list[Group]):
        self.slots, self.at, self.groups = slots, at, groups

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor) -> torch.Tensor:
        """q, k, v (1, nh, N, hs) of the flat row; keys, values (n_slots, nh, capacity + 1, hs):
        the layer's cache with this step's already stored. -> (1, nh, N, hs)"""
        nh, hs = q.shape[1], q.shape[3]
        out, start = [], 0
        for g in self.groups:
            n = g.rows * g.T

            def rows(t):  # (1, nh, N, hs) -> this group's (rows, nh, T, hs)
                return t[0, :, start:start + n].reshape(nh, g.rows, g.T, hs).transpose(0, 1)

            if g.read is None:
                ks, vs = rows(k), rows(v)
            elif g.slots is None:
                ks, vs = keys[:g.rows, :, :g.read], values[:g.rows, :, :g.read]  # views, no copy
            else:
                ks, vs = keys[g.slots, :, :g.read], values[g.slots, :, :g.read]
            mask = g.mask if g.mask.dtype == torch.bool else g.mask.to(q.dtype)  # ALiBi's bias under autocast
            y = F.scaled_dot_product_attention(rows(q), ks, vs, attn_mask=mask)  # (rows, nh, T, hs)
            out.append(y.transpose(0, 1).reshape(nh, n, hs))
            start += n
        return torch.cat(out, dim=1)[None] if len(out) > 1 else out[0][None]


@torch.no_grad()
def simulate_rm(model, vocab: Vocab, tokens: Sequence[str], prompt_len: int) -> list[str]:
    """RM's next-token prediction after every prefix `tokens[:t]`, t = prompt_len .. len(tokens),
    from one forward pass over the lanes of the complete sequence: the executable form of the
    paper's theorem that CoT can simulate RM. `tokens` must be a legal trace prefix."""
    lanes = lane_pack(tokens, prompt_len)
    if model.cfg.positions == "learned" and max(lanes.pos) >= model.cfg.block_size:  # only a table has a limit
        raise ValueError(f"position {max(lanes.pos)} beyond the model's {model.cfg.block_size}")
    idx, pos, _ = lane_tensors(lanes, vocab)
    device = next(model.parameters()).device
    mask = lane_attention_mask(lanes).to(device)
    logits = model(idx[None].to(device), pos[None].to(device), mask[None, None])[0]  # (T, V)
    owners = torch.tensor(lanes.owner[prompt_len - 1:], device=device)
    return vocab.decode(logits[owners].argmax(-1).tolist())

"""Attention backends: interchangeable ways to compute what a `Layout` allows
(`rlmlab.attention.layout`), chosen by name (`backend`):

- "dense" (`Dense`): one `scaled_dot_product_attention` call with the (B, 1, T, T) mask, or
  plain causal attention where that is exact;
- "blocks" (the CPU path, `Blocks`): the mask kept as its blocks, attention run per group of
  example pieces, at a cost that follows the examples' lengths instead of the row's; rows of up
  to `DENSE_ROW` positions and rows of one example attend dense, which wins there;
- "flex" (the CUDA path, `rlmlab.attention.flex.Flex`): one FlexAttention call per layer over
  the whole batch;
- and one step of the KV-cached decoder (`Cached`), which the decoder lays out itself.

Each is built on the host and moved to the device once (`to`), so that attention asks the device
nothing. Each has the same two calls in a forward pass: `bind(positions)` once, for what every
layer shares (ALiBi's bias on its masks, `Positions.scores`; FlexAttention's `BlockMask`), then
`attend(q, k, v, layer, dropout_p)` per layer, through `attend` below, which rotates queries and
keys (RoPE) first.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from rlmlab.attention.flex import Flex
from rlmlab.attention.layout import Backend, Layout, to_device, visible

DENSE_ROW = 128  # "blocks": rows up to this many positions attend with the dense mask, longer ones by blocks
BIAS_ELEMENTS = 1 << 24  # the most ALiBi bias entries `Dense` materializes at once


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend, positions, layer: int = 0,
           dropout_p: float = 0.0) -> torch.Tensor:
    """q, k, v (B, nh, T, hs) -> (B, nh, T, hs): attention as `backend` (bound to this forward's
    `positions`) lays it out. Keys are rotated before the backend sees them: the cache stores
    them so, and never needs their positions again."""
    q, k = positions.rotate(q, k)
    return backend.attend(q, k, v, layer, dropout_p)


def attention_kind(device: torch.device, cfg) -> str:
    """How a model of config `cfg` attends over packed training batches on `device`, the one
    place this is decided: "flex" on CUDA (one FlexAttention call per layer over rows of one
    fixed length), "blocks" on CPU, wherever attention dropout is on (FlexAttention has none)
    and for ALiBi (its bias is not written as a FlexAttention `score_mod`)."""
    flex = device.type == "cuda" and cfg.dropout == 0 and getattr(cfg, "positions", "learned") != "alibi"
    return "flex" if flex else "blocks"


def backend(layout: Layout, name: str = "blocks"):
    """The backend `name` of `layout`, on the host: "dense", "blocks" or "flex".

    "blocks" keeps the blocks for rows longer than `DENSE_ROW` that hold several segments (1.5x
    faster attention than the dense mask on CoT rows of 512); shorter rows, where the dense mask
    wins, and rows of one segment, where it is plain causal, attend dense
    (`benchmarks/bench_attention.py`)."""
    if name == "flex":
        return Flex(layout)
    if name == "dense":
        return Dense(layout)
    if name != "blocks":
        raise ValueError(f"unknown attention kind {name!r} (have: dense, blocks, flex)")
    return Blocks(layout) if layout.shape[1] > DENSE_ROW and not layout.plain else Dense(layout)


class Dense(Backend):
    """Attention over whole rows with one mask (B, 1, T, T) bool, True = may see; None: plain causal.

    Under ALiBi the bias is built a chunk of queries at a time, at most `BIAS_ELEMENTS` entries: a
    whole (B, nh, T, T) bias of a long CoT batch would take gigabytes."""

    def __init__(self, layout: Layout | None = None):
        self.mask = None if layout is None or layout.plain else layout.mask()
        self.positions = None  # set by `bind` when the encoding biases scores

    @classmethod
    def from_mask(cls, mask: torch.Tensor | None) -> "Dense":
        """A mask made by hand (the tests' references)."""
        return cls()._with(mask=mask)

    def to(self, device) -> "Dense":
        return self._with(mask=to_device(self.mask, torch.device(device)))

    def bind(self, positions) -> "Dense":
        return self._with(positions=positions) if positions.biases else self

    def attend(self, q, k, v, layer: int = 0, dropout_p: float = 0.0) -> torch.Tensor:
        if self.positions is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.mask is None,
                                                  dropout_p=dropout_p)
        B, nh, T, _ = q.shape
        pos = self.positions.pos
        step = max(1, BIAS_ELEMENTS // (B * nh * T))
        outs = []
        for s in range(0, T, step):
            e = min(T, s + step)
            if self.mask is None:  # causal: keys up to the chunk's last query
                allowed = visible(torch.arange(s, e, device=q.device)[:, None], torch.arange(e, device=q.device))
                keys, values, pos_k = k[:, :, :e], v[:, :, :e], pos[:, :e]
            else:
                allowed = self.mask[:, :, s:e]
                keys, values, pos_k = k, v, pos
            scores = self.positions.scores(allowed, pos[:, s:e], pos_k).to(q.dtype)
            outs.append(F.scaled_dot_product_attention(q[:, :, s:e], keys, values, attn_mask=scores,
                                                       dropout_p=dropout_p))
        return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def _bucket_length(n: torch.Tensor) -> torch.Tensor:
    """Padded length of a block of n positions: few distinct lengths (few kernel calls) for
    at most ~12% of padding beyond 32 positions."""
    step = torch.where(n <= 128, 16, torch.where(n <= 256, 32, 64))
    return (n + step - 1) // step * step


class Blocks(Backend):
    """The mask of packed rows kept as its blocks: each segment attends within itself.

    Why not the dense (B, 1, T, T) mask: the CPU attention kernel computes (and differentiates)
    every pair of a row whatever the mask says, and does not skip the upper triangle even for
    `is_causal`. So `attend` cuts each segment into pieces of `chunk` queries (fewer, longer
    pieces for segments longer than `max_pieces` chunks: short query pieces against long key
    ranges run the kernel far below its best rate), each with the keys up to its last query,
    gathers the pieces into batches of one padded shape and attends those. A segment of n
    positions then costs about n^2/2 + n*max(chunk, n/max_pieces)/2 pairs instead of its
    row's T^2. Padded slots repeat a real position, and the mask keeps them from every real
    query. Positions outside every segment (row padding) output zeros.
    """

    def __init__(self, layout: Layout, chunk: int = 128, max_pieces: int = 4):
        B, T = layout.shape
        row, start, length = layout.spans.unbind(1)
        frame, branch = layout.frame, layout.branch
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
            mask = None  # whole blocks, aligned: is_causal
            if frame is not None or Lq != Lk or bool((qs > 0).any()):
                lanes = ()
                if frame is not None:
                    f, b = frame.reshape(-1), branch.reshape(-1)
                    lanes = (f[q_index][:, :, None], f[k_index][:, None, :], b[q_index][:, :, None],
                             b[k_index][:, None, :])
                # within one block: at = place in the block, aligned to the piece's first query
                mask = visible((qs + i)[:, :, None], t[None, None, :], None, None, *lanes)
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

    def to(self, device) -> "Blocks":
        device = torch.device(device)
        if self.q_index.device == device:
            return self
        return self._with(groups=[(E, Lq, Lk, to_device(mask, device)) for E, Lq, Lk, mask in self.groups],
                          q_index=to_device(self.q_index, device), k_index=to_device(self.k_index, device),
                          scatter=to_device(self.scatter, device))

    def bind(self, positions) -> "Blocks":
        """Under ALiBi, every group's mask carries the bias of its queries' and keys' positions."""
        if not positions.biases:
            return self
        flat = positions.pos.reshape(-1)
        groups, q_at, k_at = [], 0, 0
        for E, Lq, Lk, mask in self.groups:
            pos_q = flat[self.q_index[q_at:q_at + E * Lq]].view(E, Lq)
            pos_k = flat[self.k_index[k_at:k_at + E * Lk]].view(E, Lk)
            if mask is None:  # the group attends with is_causal: whole blocks, aligned
                t = torch.arange(Lq, device=flat.device)
                mask = visible(t[:, None], t[None, :])
            groups.append((E, Lq, Lk, positions.scores(mask, pos_q, pos_k)))
            q_at, k_at = q_at + E * Lq, k_at + E * Lk
        return self._with(groups=groups)

    def attend(self, q, k, v, layer: int = 0, dropout_p: float = 0.0) -> torch.Tensor:
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


class Cached(Backend):
    """One decoding step over a KV cache (`rlmlab.decoding.engine.KVCache`), laid out by the
    decoder (`rlmlab.decoding.engine`) on the device.

    A step feeds every new token as one flat row (batch 1): token i's key and value are stored
    at position `at[i]` of slot `slots[i]`, and the row splits into `groups` (`Group`), each one
    attention call. One row with the groups cut out of it, rather than a batch padded to its
    longest member, lets single decoded tokens and whole new frames share one forward.
    Inference only: no dropout.
    """

    def __init__(self, cache, slots: torch.Tensor, at: torch.Tensor, groups: list[Group]):
        self.cache, self.slots, self.at, self.groups = cache, slots, at, groups

    def to(self, device) -> "Cached":
        device = torch.device(device)
        return self._with(slots=to_device(self.slots, device), at=to_device(self.at, device),
                          groups=[g._replace(slots=to_device(g.slots, device), mask=to_device(g.mask, device))
                                  for g in self.groups])

    def bind(self, positions) -> "Cached":
        """Under ALiBi, every group's mask carries the bias: a query at its token's position, a key
        read from the cache at its column (a slot holds its frame at positions 0..), a key of a
        packed new frame at its token's position."""
        if not positions.biases:
            return self
        flat = positions.pos.reshape(-1)
        groups, start = [], 0
        for g in self.groups:
            pos_q = flat[start:start + g.rows * g.T].view(g.rows, g.T)
            pos_k = pos_q if g.read is None else torch.arange(g.read, device=flat.device).expand(g.rows, g.read)
            groups.append(g._replace(mask=positions.scores(g.mask, pos_q, pos_k)))
            start += g.rows * g.T
        return self._with(groups=groups)

    def attend(self, q, k, v, layer: int = 0, dropout_p: float = 0.0) -> torch.Tensor:
        """q, k, v (1, nh, N, hs) of the flat row -> (1, nh, N, hs), after storing k and v."""
        keys, values = self.cache.store(layer, self.slots, self.at, k, v)  # (n_slots, nh, capacity + 1, hs)
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



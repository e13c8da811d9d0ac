"""Position encodings: how a token's position enters the Transformer (`model.positions`).

- "learned" (the paper's, appendix "Transformer Architecture"): a table of `block_size` vectors
  added to the token embeddings. The table is also the model's context limit: a position past
  it has no vector, and positions past the longest training example never get a gradient.
- "none" (NoPE): nothing is added; a causal decoder still tells positions apart through its mask.
- "rope": every head's queries and keys are rotated by angles proportional to their positions
  (Su et al., 2021), so a score depends on the two positions' difference only.
- "alibi": every score gets a per-head penalty -m_h * (p_q - p_k), linear in the distance from
  the query back to the key (Press et al., 2022).

Only "learned" has a table; the other three read any position, so they set no context limit
(`context_limit`): such a model trains on its split's lengths and decodes as far as the
driver's limits allow.

All four read positions from the `pos` tensor the caller passes, never from where a token sits
in its row: a packed row holds many examples (RM frames, lane-packed frames, CoT traces) that
each count from 0, and a lane-packed frame gives each call block the positions its own
example would have (docs/lanes.md). So RoPE rotates by `pos`, and ALiBi's bias is computed from
differences of `pos` for whatever (query, key) pairs an attention path lays out: the plain and
dense masks here, the blocks of a `BlockDiagonal`, the groups of a decoding step over the KV
cache (`CacheLayout`). A visible key never lies after its query in `pos`, which is why one
pass over a packed row equals the examples run one by one under every encoding.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from rlmlab.learning.attention import BlockDiagonal, CacheLayout
from rlmlab.learning.encodings import POSITION_ENCODINGS as ENCODINGS  # noqa: F401 (the names, torch-free there)

ROPE_BASE = 10_000.0  # RoFormer's: the slowest pair turns once every ~60k positions at head width 16
BIAS_ELEMENTS = 1 << 24  # the most bias entries a plain or dense ALiBi mask materializes at once


def context_limit(cfg) -> int | None:
    """The longest sequence (or frame) a model of config `cfg` reads: its learned table's size,
    or None (no limit but the driver's) for the encodings without a table. A config without a
    `positions` field is the paper's learned table."""
    return cfg.block_size if getattr(cfg, "positions", "learned") == "learned" else None


# --- RoPE ---------------------------------------------------------------------------------

def rope_angles(pos: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's angles, (B, 1, T, head_dim/2), from pos (B, T)."""
    inv_freq = ROPE_BASE ** -(torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim)
    angles = pos.to(torch.float32)[:, None, :, None] * inv_freq  # (B, 1, T, hs/2)
    return angles.cos(), angles.sin()


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, nh, T, hs) with its two halves rotated as pairs (x1_i, x2_i) by the angles."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


# --- ALiBi --------------------------------------------------------------------------------

def alibi_slopes(n_head: int, device=None) -> torch.Tensor:
    """The heads' slopes m_h (n_head,): the geometric sequence 2^(-8h/n) of the ALiBi paper,
    interleaved from the next power of two when n_head is not one."""
    def powers(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    p = 2 ** math.floor(math.log2(n_head))
    slopes = powers(p) + (powers(2 * p)[0::2][:n_head - p] if p < n_head else [])
    return torch.tensor(slopes, dtype=torch.float32, device=device)


def alibi_bias(slopes: torch.Tensor, pos_q: torch.Tensor, pos_k: torch.Tensor) -> torch.Tensor:
    """-m_h * (p_q - p_k) for queries pos_q (E, Tq) and keys pos_k (E, Tk): (E, nh, Tq, Tk).
    A key after its query (never a visible one) is clamped to distance 0."""
    dist = (pos_q[:, :, None] - pos_k[:, None, :]).clamp(min=0).to(slopes.dtype)  # (E, Tq, Tk)
    return -slopes[None, :, None, None] * dist[:, None]


def biased(mask: torch.Tensor | None, bias: torch.Tensor) -> torch.Tensor:
    """An additive float mask: the bias where `mask` (bool, broadcastable) allows, -inf elsewhere."""
    return bias if mask is None else bias.masked_fill(~mask, float("-inf"))


class AlibiMask:
    """Plain causal attention (`mask` None) or a dense bool mask (B, 1, T, T), with ALiBi's bias
    from `pos` (B, T). The bias is built a chunk of queries at a time, at most `BIAS_ELEMENTS`
    entries: a whole (B, nh, T, T) bias of a long CoT batch would take gigabytes."""

    def __init__(self, mask: torch.Tensor | None, pos: torch.Tensor, slopes: torch.Tensor):
        self.mask, self.pos, self.slopes = mask, pos, slopes

    def attend(self, q, k, v, dropout_p: float = 0.0) -> torch.Tensor:
        """q, k, v (B, nh, T, hs) -> attention output (B, nh, T, hs)."""
        B, nh, T, _ = q.shape
        step = max(1, BIAS_ELEMENTS // (B * nh * T))
        outs = []
        for s in range(0, T, step):
            e = min(T, s + step)
            if self.mask is None:  # causal: keys up to the chunk's last query
                allowed = torch.arange(e, device=q.device) <= torch.arange(s, e, device=q.device)[:, None]
                keys, values, pos_k = k[:, :, :e], v[:, :, :e], self.pos[:, :e]
            else:
                allowed = self.mask[:, :, s:e]
                keys, values, pos_k = k, v, self.pos
            bias = biased(allowed, alibi_bias(self.slopes, self.pos[:, s:e], pos_k)).to(q.dtype)
            outs.append(F.scaled_dot_product_attention(q[:, :, s:e], keys, values, attn_mask=bias,
                                                       dropout_p=dropout_p))
        return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def alibi_blocks(blocks: BlockDiagonal, pos: torch.Tensor, slopes: torch.Tensor) -> BlockDiagonal:
    """A `BlockDiagonal` whose pieces carry ALiBi's bias from the positions `pos` (B, T) of their
    queries and keys (built once per forward; every layer reuses it)."""
    flat = pos.reshape(-1)
    out = copy.copy(blocks)
    groups, q_at, k_at = [], 0, 0
    for E, Lq, Lk, mask in blocks.groups:
        pos_q = flat[blocks.q_index[q_at:q_at + E * Lq]].view(E, Lq)
        pos_k = flat[blocks.k_index[k_at:k_at + E * Lk]].view(E, Lk)
        if mask is None:  # the group attends with is_causal: whole blocks, aligned
            mask = torch.ones(Lq, Lk, dtype=torch.bool, device=pos.device).tril()
        groups.append((E, Lq, Lk, biased(mask, alibi_bias(slopes, pos_q, pos_k))))
        q_at, k_at = q_at + E * Lq, k_at + E * Lk
    out.groups = groups
    return out


def alibi_cached(layout: CacheLayout, pos: torch.Tensor, slopes: torch.Tensor) -> CacheLayout:
    """A decoding step's `CacheLayout` whose groups carry ALiBi's bias: a query at its token's
    position `pos` (1, N), a key read from the cache at its column (a slot holds its frame at
    positions 0..), a key of a packed new frame at its token's position."""
    flat = pos.reshape(-1)
    groups, start = [], 0
    for g in layout.groups:
        pos_q = flat[start:start + g.rows * g.T].view(g.rows, g.T)
        pos_k = pos_q if g.read is None else torch.arange(g.read, device=pos.device).expand(g.rows, g.read)
        groups.append(g._replace(mask=biased(g.mask, alibi_bias(slopes, pos_q, pos_k))))
        start += g.rows * g.T
    return CacheLayout(layout.slots, layout.at, groups)


# --- one forward's positions ----------------------------------------------------------------

class Positions:
    """What one forward's positions `pos` (B, T) do inside attention: `rotate` queries and keys
    (RoPE) and `mask` (ALiBi's bias on whatever mask the caller gave). Identity for "learned"
    and "none", whose positions enter (or not) through the embeddings alone."""

    def __init__(self, encoding: str, pos: torch.Tensor, n_head: int, head_dim: int):
        self.encoding, self.pos = encoding, pos
        self.rope = rope_angles(pos, head_dim) if encoding == "rope" else None
        self.slopes = alibi_slopes(n_head, pos.device) if encoding == "alibi" else None

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rope is None:
            return q, k
        return rope_rotate(q, *self.rope), rope_rotate(k, *self.rope)

    def mask(self, attn_mask):
        """The mask every layer attends with: the caller's, or for ALiBi the caller's with the
        bias (an `AlibiMask` for plain causal and dense masks, a biased `BlockDiagonal` or
        `CacheLayout`)."""
        if self.slopes is None:
            return attn_mask
        if isinstance(attn_mask, BlockDiagonal):
            return alibi_blocks(attn_mask, self.pos, self.slopes)
        if isinstance(attn_mask, CacheLayout):
            return alibi_cached(attn_mask, self.pos, self.slopes)
        return AlibiMask(attn_mask, self.pos, self.slopes)

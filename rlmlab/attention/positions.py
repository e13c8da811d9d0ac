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
differences of `pos` for whatever (query, key) pairs an attention backend lays out
(`rlmlab.attention.backends`: the dense mask, the pieces of the blocks, the groups of a
decoding step over the KV cache), each through `Positions.scores`. A visible key never lies
after its query in `pos`, which is why one pass over a packed row equals the examples run one
by one under every encoding.
"""

from __future__ import annotations

import math

import torch

from rlmlab.attention.encodings import POSITION_ENCODINGS as ENCODINGS  # noqa: F401 (the names, torch-free there)

ROPE_BASE = 10_000.0  # RoFormer's: the slowest pair turns once every ~60k positions at head width 16


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


# --- one forward's positions ----------------------------------------------------------------

class Positions:
    """What one forward's positions `pos` (B, T) do inside attention: `rotate` queries and keys
    (RoPE) and weigh the scores of visible pairs (`scores`: ALiBi's bias). Identity for "learned"
    and "none", whose positions enter (or not) through the embeddings alone."""

    def __init__(self, encoding: str, pos: torch.Tensor, n_head: int, head_dim: int):
        self.encoding, self.pos = encoding, pos
        self.rope = rope_angles(pos, head_dim) if encoding == "rope" else None
        self.slopes = alibi_slopes(n_head, pos.device) if encoding == "alibi" else None

    @property
    def biases(self) -> bool:
        """Whether `scores` adds anything: backends then build their masks with it, once per forward."""
        return self.slopes is not None

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rope is None:
            return q, k
        return rope_rotate(q, *self.rope), rope_rotate(k, *self.rope)

    def scores(self, allowed: torch.Tensor, pos_q: torch.Tensor, pos_k: torch.Tensor) -> torch.Tensor:
        """The attention mask of queries at pos_q (E, Tq) and keys at pos_k (E, Tk): `allowed`
        (bool, broadcastable to (E, nh, Tq, Tk)) itself, or for ALiBi the bias where allowed and
        -inf elsewhere."""
        if self.slopes is None:
            return allowed
        return biased(allowed, alibi_bias(self.slopes, pos_q, pos_k))

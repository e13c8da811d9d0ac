"""The decoder-only Transformer both learners share (paper appendix "Transformer Architecture").

Pre-LayerNorm blocks, learned absolute positional embeddings, GELU MLP with expansion 4,
attention through `scaled_dot_product_attention`. CoT and RM use this one class: what
differs between them is only which tokens a row holds, their positions and which
of them attend to each other, all given by the caller (`pos`, `attn_mask`).

Packed training rows pass their mask as a `BlockDiagonal` (the blocks of a block-diagonal mask)
rather than a dense tensor: attention then runs per example, at a cost that grows with the
examples' lengths instead of the row's.

A `cache` (see `rlmlab.infer.KVCache`) may be passed for decoding: each attention layer then
hands it its queries, keys and values, and the cache stores the new keys/values and computes
the attention over whatever its caller laid out (cached frames, freshly packed ones), masks
included; `attn_mask` is not used then.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from rlmlab.errors import ConfigError
from rlmlab.lanes import lane_visible


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 64
    """Vocabulary size (set from the data's vocabulary, not by hand)."""
    n_layer: int = 6
    """Transformer blocks."""
    n_head: int = 6
    """Attention heads per block; must divide n_embd."""
    n_embd: int = 384
    """Residual stream width."""
    block_size: int = 2048
    """Positional-embedding table size: the longest sequence (or frame) the model reads."""
    dropout: float = 0.0
    """Dropout on attention and residual branches (the paper uses none)."""

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            want = float if f.name == "dropout" else int
            if not isinstance(v, want) or isinstance(v, bool):
                if not (want is float and isinstance(v, int) and not isinstance(v, bool)):
                    raise ConfigError(f"model.{f.name} must be {want.__name__}, got {v!r}")
        if min(self.vocab_size, self.n_layer, self.n_head, self.n_embd, self.block_size) < 1:
            raise ConfigError("model sizes must be positive")
        if self.n_embd % self.n_head:
            raise ConfigError(f"model.n_head={self.n_head} must divide model.n_embd={self.n_embd}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict:
        return asdict(self)


# Context sizes: RM reads one frame (short), CoT the whole flattened trace (long).
PRESETS: dict[str, dict[str, dict]] = {
    # The paper's backbone: 6 layers, 6 heads, width 384; 2,048 positions for RM, 4,096 for CoT.
    "paper": {"rm": dict(n_layer=6, n_head=6, n_embd=384, block_size=2048),
              "cot": dict(n_layer=6, n_head=6, n_embd=384, block_size=4096)},
    # CPU-sized: 3 layers of width 128 train at 8-24k tok/s on 2 cores and learn as much per
    # token as 4 layers of width 256 (shared/notes/cpu-feasibility.md). The positional tables
    # must cover the longest frame / trace of the splits the small experiments evaluate.
    "small": {"rm": dict(n_layer=3, n_head=4, n_embd=128, block_size=512),
              "cot": dict(n_layer=3, n_head=4, n_embd=128, block_size=4096)},
    # The small model with 8 heads of width 16: CoT learns its copies faster per CPU minute
    # (docs/recipe.md); the paper-cpu preset trains both learners with it.
    "cpu": {"rm": dict(n_layer=3, n_head=8, n_embd=128, block_size=512),
            "cot": dict(n_layer=3, n_head=8, n_embd=128, block_size=4096)},
    # For tests: runs in milliseconds.
    "tiny": {"rm": dict(n_layer=2, n_head=2, n_embd=32, block_size=256),
             "cot": dict(n_layer=2, n_head=2, n_embd=32, block_size=2048)},
}


def preset(name: str, view: str, vocab_size: int, **overrides) -> ModelConfig:
    """The preset's sizes for a view: the "rm" column for views with short contexts (active
    frames, windows, widened to hold a window), the "cot" column for whole traces and reductions."""
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r} (have: {', '.join(PRESETS)})")
    from rlmlab.observe import observer

    obs = observer(view)
    base = dict(PRESETS[name][obs.family])
    if obs.context_bound is not None:
        # A window of K tokens must fit the positional table whatever the preset.
        base["block_size"] = max(base["block_size"], obs.context_bound)
    return ModelConfig(vocab_size=vocab_size, **{**base, **overrides})


def _bucket_length(n: torch.Tensor) -> torch.Tensor:
    """Padded length of a block of n positions: few distinct lengths (few kernel calls) for
    at most ~12% of padding beyond 32 positions."""
    step = torch.where(n <= 128, 16, torch.where(n <= 256, 32, 64))
    return (n + step - 1) // step * step


class BlockDiagonal:
    """A block-diagonal attention mask over packed rows, kept as its blocks.

    Block i is one example: `length[i]` positions from `start[i]` in row `row[i]`, attending
    causally within itself; for lane-packed examples (`frame`, `branch` given, as in
    `rlmlab.packing.PackedBatch`) a query further sees only keys of its own frame that are on
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


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_embd = cfg.n_head, cfg.n_embd
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x, attn_mask=None, cache=None, layer: int = 0):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        drop = self.dropout if self.training else 0.0
        if cache is not None:
            y = cache.attend(layer, q, k, v)  # (B, nh, T, hs)
        elif attn_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        elif isinstance(attn_mask, BlockDiagonal):
            y = attn_mask.attend(q, k, v, drop)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=drop)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, attn_mask=None, cache=None, layer: int = 0):
        x = x + self.drop(self.attn(self.ln1(x), attn_mask, cache, layer))
        return x + self.drop(self.mlp(self.ln2(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied input/output embeddings
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def num_params(self, include_positions: bool = True) -> int:
        """Distinct parameters (the tied embedding counted once); optionally without the positional table."""
        n = sum(p.numel() for p in self.parameters())
        return n if include_positions else n - self.wpe.weight.numel()

    def forward(self, idx, pos=None, attn_mask=None, cache=None):
        """idx (B, T) token ids; pos (B, T) positions (default 0..T-1); attn_mask (B, 1, T, T) bool,
        True = may attend, or a `BlockDiagonal` (default causal); cache: see the module docstring.
        Returns logits (B, T, V)."""
        B, T = idx.shape
        if pos is None:
            pos = torch.arange(T, device=idx.device).expand(B, T)
        if int(pos.max()) >= self.cfg.block_size:
            raise ValueError(f"position {int(pos.max())} beyond the model's {self.cfg.block_size}")
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask, cache, i)
        return self.lm_head(self.ln_f(x))  # (B, T, V)

"""The decoder-only Transformer both learners share (paper appendix "Transformer Architecture").

Pre-LayerNorm blocks, learned absolute positional embeddings (or another encoding,
`cfg.positions`: see `rlmlab.learning.positions`), GELU MLP with expansion 4, attention
through `scaled_dot_product_attention`. CoT and RM use this one class: what
differs between them is only which tokens a row holds, their positions and which
of them attend to each other, all given by the caller (`pos`, `attn_mask`).

Packed training rows pass their mask as a `BlockDiagonal` (the CPU path: the blocks of a
block-diagonal mask, attention run per example, at a cost that grows with the examples' lengths
instead of the row's) or a `FlexMask` (the CUDA path: one FlexAttention call per layer), rather
than a dense tensor. Both are built on the host with the batch: the forward pass reads nothing
back from the device, so it runs without a host wait and compiles into one graph. Positions are
checked where they are assigned (`collate`, the decoder), not here.

For decoding, a `cache` (`rlmlab.decoding.cache.KVCache`) comes with a `CacheLayout` as the
mask: each attention layer stores its new keys/values in the cache and attends as the layout
says (new tokens against their slots' cached frames, freshly packed frames among themselves).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch.nn.attention.flex_attention import BlockMask

from rlmlab.learning.attention import BlockDiagonal, FlexMask, flex_attend
from rlmlab.learning.config import MODEL_PRESETS, ModelConfig, preset  # noqa: F401 (the model's sizes, importable from here too)
from rlmlab.learning.positions import AlibiMask, Positions


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_embd = cfg.n_head, cfg.n_embd
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x, attn_mask=None, cache=None, layer: int = 0, positions: Positions | None = None):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        if positions is not None:
            q, k = positions.rotate(q, k)  # RoPE; the cache stores keys rotated
        drop = self.dropout if self.training else 0.0
        if cache is not None:  # attn_mask is the step's CacheLayout
            keys, values = cache.store(layer, attn_mask.slots, attn_mask.at, k, v)
            y = attn_mask.attend(q, k, v, keys, values)
        elif attn_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        elif isinstance(attn_mask, (BlockDiagonal, AlibiMask)):
            y = attn_mask.attend(q, k, v, drop)
        elif isinstance(attn_mask, BlockMask):
            if drop:
                raise ValueError("FlexAttention applies no attention dropout: use a BlockDiagonal mask")
            y = flex_attend(q, k, v, attn_mask)
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

    def forward(self, x, attn_mask=None, cache=None, layer: int = 0, positions: Positions | None = None):
        x = x + self.drop(self.attn(self.ln1(x), attn_mask, cache, layer, positions))
        return x + self.drop(self.mlp(self.ln2(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        # The paper's learned table; the other encodings act inside attention (`Positions`).
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.positions == "learned" else None
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
        return n if include_positions or self.wpe is None else n - self.wpe.weight.numel()

    def forward(self, idx, pos=None, attn_mask=None, cache=None):
        """idx (B, T) token ids; pos (B, T) positions (default 0..T-1), each below block_size;
        attn_mask (B, 1, T, T) bool, True = may attend, or a `BlockDiagonal` or `FlexMask`
        (default causal), or with a cache a `CacheLayout` (see the module docstring). Returns
        logits (B, T, V)."""
        B, T = idx.shape
        if pos is None:
            if self.wpe is not None and T > self.cfg.block_size:
                raise ValueError(f"{T} positions, beyond the model's {self.cfg.block_size}")
            pos = torch.arange(T, device=idx.device).expand(B, T)
        c = self.cfg
        positions = Positions(c.positions, pos, c.n_head, c.n_embd // c.n_head)
        if isinstance(attn_mask, FlexMask):
            if positions.slopes is not None:  # FlexAttention would need ALiBi as a score_mod
                raise ValueError("ALiBi has no FlexAttention path: train it with the blocks attention")
            attn_mask = attn_mask.block_mask()  # once for all layers
        else:
            attn_mask = positions.mask(attn_mask)  # ALiBi: the bias, built once for every layer
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(pos)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask, cache, i, positions)
        return self.lm_head(self.ln_f(x))  # (B, T, V)

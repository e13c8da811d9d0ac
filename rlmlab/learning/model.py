"""The decoder-only Transformer both learners share (paper appendix "Transformer Architecture").

Pre-LayerNorm blocks, learned absolute positional embeddings (or another encoding,
`cfg.positions`: see `rlmlab.attention.positions`), GELU MLP with expansion 4, attention
through `scaled_dot_product_attention`. CoT and RM use this one class: what
differs between them is only which tokens a row holds, their positions and which
of them attend to each other, all given by the caller (`pos`, `attn`).

`attn` is an attention backend (`rlmlab.attention.backends`), built on the host from the batch's
`Layout` (`rlmlab.attention.layout`): the dense mask, the blocks of packed rows (the CPU path),
FlexAttention (the CUDA path), or one step over a KV cache (the decoder), which stores each
layer's new keys and values as it attends. The forward pass reads nothing back from the device,
so it runs without a host wait and compiles into one graph. Positions are checked where they are
assigned (`collate`, the decoder), not here.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from rlmlab.attention.backends import Dense, attend
from rlmlab.attention.positions import Positions
from rlmlab.learning.config import MODEL_PRESETS, ModelConfig, preset  # noqa: F401 (the model's sizes, importable from here too)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_embd = cfg.n_head, cfg.n_embd
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x, attn, positions: Positions, layer: int = 0):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        y = attend(q, k, v, attn, positions, layer, self.dropout if self.training else 0.0)  # (B, nh, T, hs)
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

    def forward(self, x, attn, positions: Positions, layer: int = 0):
        x = x + self.drop(self.attn(self.ln1(x), attn, positions, layer))
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

    def forward(self, idx, pos=None, attn=None):
        """idx (B, T) token ids; pos (B, T) positions (default 0..T-1), each below block_size;
        attn an attention backend (default plain causal, `Dense()`). Returns logits (B, T, V)."""
        B, T = idx.shape
        if pos is None:
            if self.wpe is not None and T > self.cfg.block_size:
                raise ValueError(f"{T} positions, beyond the model's {self.cfg.block_size}")
            pos = torch.arange(T, device=idx.device).expand(B, T)
        c = self.cfg
        positions = Positions(c.positions, pos, c.n_head, c.n_embd // c.n_head)
        attn = (Dense() if attn is None else attn).bind(positions)  # what every layer shares, built once
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(pos)
        for i, block in enumerate(self.blocks):
            x = block(x, attn, positions, i)
        return self.lm_head(self.ln_f(x))  # (B, T, V)

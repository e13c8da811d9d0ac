"""CoT can simulate RM: the executable form of the paper's theorem.

One Transformer, handed RM's lane positions and lane mask for a flattened sequence
(`rlmlab.learning.lanes`), predicts in one forward pass what RM predicts after every prefix.
It says what one model computes on those inputs, for every position encoding; a CoT model
reading the flattened trace at positions 0..n-1 is not that model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlmlab.learning.attention import Dense, lane_tensors
from rlmlab.learning.lanes import lane_pack
from rlmlab.learning.layout import Layout
from rlmlab.task.vocab import Vocab


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
    attn = Dense(Layout.of_lanes(lanes)).to(device)
    logits = model(idx[None].to(device), pos[None].to(device), attn)[0]  # (T, V)
    owners = torch.tensor(lanes.owner[prompt_len - 1:], device=device)
    return vocab.decode(logits[owners].argmax(-1).tolist())

"""CoT can simulate RM: the executable form of the paper's theorem.

One Transformer, handed RM's lane positions and lane mask for a flattened sequence
(`rlmlab.learning.lanes`), predicts in one forward pass what RM predicts after every prefix.
It says what one model computes on those inputs, for every position encoding; a CoT model
reading the flattened trace at positions 0..n-1 is not that model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlmlab.attention.backends import Dense
from rlmlab.attention.layout import Layout
from rlmlab.learning.lanes import IGNORE, Lanes, lane_pack
from rlmlab.task.vocab import Vocab


def lane_tensors(lanes: Lanes, vocab: Vocab) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(idx, pos, labels) of a lane sequence as 1-D tensors; labels use IGNORE where there is no target."""
    idx = torch.tensor(vocab.encode(lanes.tokens))
    pos = torch.tensor(lanes.pos)
    ids = vocab.ids
    labels = torch.tensor([IGNORE if t is None else ids[t] for t in lanes.labels])
    return idx, pos, labels


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
    attn = Dense(Layout.of_lanes(lanes.frame, lanes.branch)).to(device)
    logits = model(idx[None].to(device), pos[None].to(device), attn)[0]  # (T, V)
    owners = torch.tensor(lanes.owner[prompt_len - 1:], device=device)
    return vocab.decode(logits[owners].argmax(-1).tolist())

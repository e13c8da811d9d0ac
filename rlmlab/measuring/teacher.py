"""The one teacher-forced forward pass: greedy next-token predictions of a model at every
target position of a set of rows, each row read once.

Scores (`rlmlab.measuring.score.per_token_hits`), the invariance probe and the frame-error tables all
measure a model through this function; they differ only in which rows they build (the learner's
examples of a trace, or each active-frame example alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlmlab.attention.positions import context_limit
from rlmlab.decoding.predictor import NO_TOKEN

Row = tuple[list[int], int]  # (token ids, m): predict ids[i] from ids[:i] for every i >= m


@torch.no_grad()
def teacher_forced_argmax(model, rows: Sequence[Row], max_tokens: int = 16384,
                          progress: Callable[[int], None] | None = None,
                          positions: Sequence[list[int]] | None = None) -> list[list[int]]:
    """out[r][j]: the model's argmax after reading rows[r].ids[:m + j], for every target j of
    row r. Rows are sorted by length and batched up to `max_tokens` padded positions; a target
    the model cannot read (beyond its block size, as in generation) gets NO_TOKEN.
    `positions[r]`, when given, places row r's tokens (`model.position_index`; default
    0..n-1); a row is read up to its first token placed beyond the block.
    `progress(k)` is called as k more rows are done."""
    block = context_limit(model.cfg)
    if block is None:  # no limit: all readable
        block = max((len(ids) for ids, _ in rows), default=1) if positions is None else None
    device = next(model.parameters()).device
    out: list[list[int]] = [[NO_TOKEN] * (len(ids) - m) for ids, m in rows]

    def readable(r: int) -> int:  # leading tokens of row r the model can read
        n = len(rows[r][0])
        if positions is None:
            return min(n, block)
        if block is None:
            return n
        return next((i for i, p in enumerate(positions[r]) if p >= block), n)

    reads = [readable(r) for r in range(len(rows))]
    order = sorted((r for r in range(len(rows)) if rows[r][1] <= reads[r] and len(rows[r][0]) > rows[r][1]),
                   key=lambda r: reads[r])
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end + 1 - start) * reads[order[end]] <= max_tokens:
            end += 1
        batch = order[start:end]
        T = max(reads[r] for r in batch)  # positions read
        idx = torch.zeros(len(batch), T, dtype=torch.long)  # right-padded; causal, so padding is unseen
        pos = None if positions is None else torch.zeros(len(batch), T, dtype=torch.long)
        for b, r in enumerate(batch):
            idx[b, :reads[r]] = torch.tensor(rows[r][0][:reads[r]])
            if pos is not None:
                pos[b, :reads[r]] = torch.tensor(positions[r][:reads[r]])
        # Models without a position index (test oracles included) take the tokens alone.
        logits = model(idx.to(device)) if pos is None else model(idx.to(device), pos.to(device))
        pred = logits.argmax(-1).cpu()  # (b, T): pred[:, i-1] predicts token i
        for b, r in enumerate(batch):
            ids, m = rows[r]
            last = min(len(ids), reads[r] + 1)  # tokens [m, last) are readable
            out[r][:last - m] = pred[b, m - 1:last - 1].tolist()
        if progress is not None:
            progress(len(batch))
        start = end
    if progress is not None and len(order) < len(rows):
        progress(len(rows) - len(order))  # rows with nothing readable
    return out

"""The one teacher-forced forward pass: greedy next-token predictions of a model at every
target position of a set of rows, each row read once.

Scores (`rlmlab.measuring.score.per_token_hits`), the invariance probe and the frame-error tables all
measure a model through this function; they differ only in which rows they build (the learner's
examples of a trace, or each active-frame example alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlmlab.decoding.predictor import NO_TOKEN
from rlmlab.learning.positions import context_limit

Row = tuple[list[int], int]  # (token ids, m): predict ids[i] from ids[:i] for every i >= m


@torch.no_grad()
def teacher_forced_argmax(model, rows: Sequence[Row], max_tokens: int = 16384,
                          progress: Callable[[int], None] | None = None) -> list[list[int]]:
    """out[r][j]: the model's argmax after reading rows[r].ids[:m + j], for every target j of
    row r. Rows are sorted by length and batched up to `max_tokens` padded positions; a target
    the model cannot read (beyond its block size, as in generation) gets NO_TOKEN.
    `progress(k)` is called as k more rows are done."""
    block = context_limit(model.cfg) or max((len(ids) for ids, _ in rows), default=1)  # no limit: all readable
    device = next(model.parameters()).device
    out: list[list[int]] = [[NO_TOKEN] * (len(ids) - m) for ids, m in rows]
    order = sorted((r for r in range(len(rows)) if rows[r][1] <= block and len(rows[r][0]) > rows[r][1]),
                   key=lambda r: min(len(rows[r][0]), block))
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end + 1 - start) * min(len(rows[order[end]][0]), block) <= max_tokens:
            end += 1
        batch = order[start:end]
        T = min(max(len(rows[r][0]) for r in batch), block)  # positions read
        idx = torch.zeros(len(batch), T, dtype=torch.long)  # right-padded; causal, so padding is unseen
        for b, r in enumerate(batch):
            ids = rows[r][0][:T]
            idx[b, :len(ids)] = torch.tensor(ids)
        pred = model(idx.to(device)).argmax(-1).cpu()  # (b, T): pred[:, i-1] predicts token i
        for b, r in enumerate(batch):
            ids, m = rows[r]
            last = min(len(ids), T + 1)  # tokens [m, last) are readable
            out[r][:last - m] = pred[b, m - 1:last - 1].tolist()
        if progress is not None:
            progress(len(batch))
        start = end
    if progress is not None and len(order) < len(rows):
        progress(len(rows) - len(order))  # rows with nothing readable
    return out

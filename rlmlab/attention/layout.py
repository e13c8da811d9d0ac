"""Who may attend to whom: the one description of a batch's attention (`Layout`), built on the
host, and the one rule every attention backend applies to it (`visible`).

A batch is rows of segments laid end to end: the examples of packed training rows, or the new
frames of a decoding step. A lane-packed RM example (docs/lanes.md) further splits its segment
into frames and pending call blocks. A query sees a key when

- the key is not after it in its row (or in its cached frame): causality is by place, never by
  position, because a lane-packed frame reuses positions (a trunk token after a closed call block
  sits at the block's positions);
- both lie in one segment;
- for lanes, both lie in one frame and the key is on the trunk or on the query's own call block.

Positions are no part of it: they weigh the keys a query sees (`rlmlab.attention.positions`),
never decide which. The backends of `rlmlab.attention.backends` (dense mask, blocks) and
`rlmlab.attention.flex` (FlexAttention) are built from a `Layout` and share `Backend`; the
decoder lays out the groups of a KV-cached step with the same rule (`rlmlab.decoding.engine`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def visible(q_at, k_at, q_seg=None, k_seg=None, q_frame=None, k_frame=None, q_branch=None, k_branch=None):
    """Whether each query may see each key: the rule above, for ids that broadcast against each
    other ((..., Tq, 1) against (..., 1, Tk), or the scalars of a FlexAttention `mask_mod`).
    `at`: place in the row or cached frame; `seg`: segment; `frame` and `branch` (-1 = trunk):
    lane ids. A pair of ids left None is the same for every pair (one segment; no lanes)."""
    ok = k_at <= q_at
    if q_seg is not None:
        ok = ok & (q_seg == k_seg)
    if q_frame is not None:
        ok = ok & (q_frame == k_frame) & ((k_branch == -1) | (q_branch == k_branch))
    return ok


@dataclass
class Layout:
    """The attention of B rows of T positions. Row padding is a segment of its own (-1) whose
    positions see earlier padding, so that no query row is empty (softmax of an empty row is NaN)
    and no segment ever sees padding."""

    seg: torch.Tensor  # (B, T) segment of each position (ordinal in `spans`), -1 = row padding
    spans: torch.Tensor  # (k, 3) row, start, length of each segment, in row-major order
    frame: torch.Tensor | None = None  # (B, T) lanes: frame id
    branch: torch.Tensor | None = None  # (B, T) lanes: pending call block id, -1 = trunk
    plain: bool = False  # one segment per row, from its first position, no lanes: plain causal is exact

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.seg.shape)

    @classmethod
    def packed(cls, B: int, T: int, row: torch.Tensor, start: torch.Tensor, length: torch.Tensor,
               frame: torch.Tensor | None = None, branch: torch.Tensor | None = None) -> "Layout":
        """Segment i: `length[i]` positions from `start[i]` of row `row[i]` (row-major order)."""
        dev = row.device
        k = len(length)
        first = torch.cumsum(length, 0) - length
        within = torch.arange(int(length.sum()), device=dev) - torch.repeat_interleave(first, length)
        seg = torch.full((B * T,), -1, dtype=torch.long, device=dev)
        seg[torch.repeat_interleave(row * T + start, length) + within] = torch.repeat_interleave(
            torch.arange(k, device=dev), length)
        plain = (frame is None and k == B and bool((row == torch.arange(k, device=dev)).all())
                 and bool((start == 0).all()))
        return cls(seg.view(B, T), torch.stack([row, start, length], 1), frame, branch, plain)

    @classmethod
    def of_lanes(cls, frame: Sequence[int], branch: Sequence[int]) -> "Layout":
        """One lane sequence (`rlmlab.learning.lanes.Lanes`: its `frame` and `branch` ids) as one
        row holding one segment."""
        T = len(frame)
        return cls(torch.zeros(1, T, dtype=torch.long), torch.tensor([[0, 0, T]]),
                   torch.tensor(frame)[None], torch.tensor(branch)[None])

    def mask(self) -> torch.Tensor:
        """(B, 1, T, T) bool, True = may see: the rule over whole rows."""
        T = self.seg.shape[1]
        t = torch.arange(T, device=self.seg.device)

        def q(x):
            return None if x is None else x[:, :, None]

        def k(x):
            return None if x is None else x[:, None, :]

        return visible(t[:, None], t[None, :], q(self.seg), k(self.seg), q(self.frame), k(self.frame),
                       q(self.branch), k(self.branch)).unsqueeze(1)


class Backend:
    """What every backend shares: `to(device)`, `bind(positions)` (nothing to bind by default)
    and `attend(q, k, v, layer, dropout_p)`; copies differ only in the fields they replace."""

    def _with(self, **changes):
        out = copy.copy(self)
        out.__dict__.update(changes)
        return out

    def bind(self, positions):
        return self


def to_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """A host tensor on `device`; to CUDA from pinned memory without blocking the host (the copy
    is ordered before any kernel that reads it on the same stream)."""
    if t is None or t.device == device:
        return t
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)

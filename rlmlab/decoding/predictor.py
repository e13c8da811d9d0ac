"""What the decoding driver and its predictors exchange.

A *predictor* maps a batch of rows to next-token ids: each step the driver hands it one `Feed`
per live row, and it answers one id per feed (`NO_TOKEN` when it has none). Rows live in a
fixed number of *slots*; a predictor keeps whatever per-slot state it wants (a KV cache, an
oracle's matches) and learns from each feed's `keep` and `event` how much of that state still
holds, so that it can feed only what is new.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

NO_TOKEN = -1  # a predictor's "I have no next token" (the oracle off the canonical path)


class Feed(NamedTuple):
    """What a predictor sees of one row this step."""

    slot: int  # the row's slot: stable for the row's lifetime, reused by the next row
    seq: list[int]  # the observation: CoT the trace so far, RM the active frame, ... (read-only)
    keep: int  # leading tokens of seq already fed to this slot's current frame and still valid
    event: str | None  # NEW row in the slot, PUSH of a new frame, POP back to the parent, or None
    pos: list[int] | None = None  # the position of each token of seq (`model.position_index`); None: 0..n-1


class Predictor(Protocol):
    block_size: int | None  # longest seq it can read (None: unbounded)
    # Optional: where a model counts positions from (`model.position_index`); absent or None: its
    # learner's own. A predictor that wraps a model passes the model's on.
    position_index: str | None

    def reset(self, n_slots: int) -> None: ...

    def __call__(self, feeds: Sequence[Feed]) -> list[int]: ...


class TeacherForced:
    """Runs `predictor` at every step (its caches, its `logits`) but emits `guide`'s tokens.

    With the oracle as guide, a model is driven along the canonical trace: its logits can be
    compared step by step, and its speed measured on the true trace lengths."""

    def __init__(self, predictor: Predictor, guide: Predictor):
        self.predictor, self.guide = predictor, guide
        self.block_size = predictor.block_size
        self.position_index = getattr(predictor, "position_index", None)  # the driver places tokens for it

    def reset(self, n_slots: int) -> None:
        self.predictor.reset(n_slots)
        self.guide.reset(n_slots)

    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        self.predictor(feeds)
        return self.guide(feeds)

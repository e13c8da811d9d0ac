"""Packing variable-length examples into fixed-length rows without cross-talk.

An example of n tokens occupies n-1 row positions: the inputs tokens[:-1], each predicting
the next token (targets tokens[1:], -100 where the loss mask is off). Within a row every
example restarts its positions at 0 and attends only to itself (block-diagonal causal mask),
so a packed row computes exactly what the examples would compute one by one.

Rows have a base length `row_len`, filled best-fit from a window of pending examples, which
keeps padding at a few percent. A batch's `Layout` (`rlmlab.attention.layout`) defines what a
packed row computes; training hands it to the model through the attention backend that is
fastest on its device (`PackedBatch.attention`): on CPU "blocks", whose attention cost follows
the examples' lengths, not the row's; on CUDA "flex" (one attention call per layer).
An example longer than `row_len` gets a row of its own, rounded up to a multiple of 64
positions: such rows need no mask at all (plain causal attention), and long CoT traces are
most of CoT's tokens. On CUDA the rows of a micro-batch are laid end to end in one row of a
fixed length (`flat_micro_batches`), so that every forward pass has one shape and a compiled
model one graph.

`RowStream` turns a dataset into an endless, seeded, resumable sequence of rows: epoch e
shuffles the examples with seed (seed, e) and packs them; its state is (epoch, row cursor).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from rlmlab.attention.backends import backend
from rlmlab.attention.layout import Layout, to_device
from rlmlab.learning.lanes import IGNORE


@dataclass(frozen=True)
class Row:
    """One packed row: `length` positions holding `examples` (dataset indices) left to right."""

    length: int
    examples: tuple[int, ...]


SOLO_ROUND = 64  # a row of its own is rounded up to a multiple of this many positions


def row_length_for(n: int, row_len: int) -> int:
    """The row an example of n positions opens: the base row, or its own rounded up."""
    return row_len if n <= row_len else -(-n // SOLO_ROUND) * SOLO_ROUND


def pack_rows(lengths: np.ndarray, row_len: int, order: np.ndarray | None = None, window: int = 2048) -> list[Row]:
    """Pack examples (of `lengths` positions each, taken in `order`) into rows.

    Each row starts with the oldest pending example. One longer than `row_len` stays alone;
    otherwise the row repeatedly takes the longest pending example that still fits (oldest
    first among equal lengths) from a window of the next `window` examples. Every example is
    placed exactly once.
    """
    lengths = np.asarray(lengths)
    order = np.arange(len(lengths)) if order is None else np.asarray(order)
    if len(order) and int(lengths[order].min()) < 1:
        raise ValueError("every packed example needs at least one position")
    lens = lengths.tolist()
    by_len: dict[int, deque[int]] = {}
    present: list[int] = []  # sorted lengths with pending examples
    arrival: deque[int] = deque()
    taken = np.zeros(len(lengths), dtype=bool)
    source = iter(order.tolist())
    pending = 0
    rows: list[Row] = []

    def refill() -> None:
        nonlocal pending
        while pending < window:
            i = next(source, None)
            if i is None:
                return
            n = lens[i]
            q = by_len.get(n)
            if q is None:
                q = by_len[n] = deque()
            if not q:
                bisect.insort(present, n)
            q.append(i)
            arrival.append(i)
            pending += 1

    def take(n: int) -> int:
        nonlocal pending
        q = by_len[n]
        i = q.popleft()
        if not q:
            del present[bisect.bisect_left(present, n)]
        taken[i] = True
        pending -= 1
        return i

    refill()
    while pending:
        while taken[arrival[0]]:
            arrival.popleft()
        head = take(lens[arrival.popleft()])  # the oldest pending is also the oldest of its length
        T = row_length_for(lens[head], row_len)
        free = T - lens[head] if T == row_len else 0
        members = [head]
        refill()
        while present and present[0] <= free:
            n = present[bisect.bisect_right(present, free) - 1]
            members.append(take(n))
            free -= n
            refill()
        rows.append(Row(T, tuple(members)))
    return rows


def padding_fraction(rows: list[Row], lengths: np.ndarray) -> float:
    """Share of processed row positions that hold no example."""
    total = sum(r.length for r in rows)
    used = sum(int(lengths[list(r.examples)].sum()) for r in rows)
    return 1.0 - used / total if total else 0.0


@dataclass
class PackedBatch:
    """Rows of one length, ready for `Transformer.forward(idx, pos, attn)`."""

    idx: torch.Tensor  # (B, T) input ids (pad id on padding)
    targets: torch.Tensor  # (B, T) next-token ids, IGNORE where there is no loss
    pos: torch.Tensor  # (B, T) position within the example, 0 on padding
    doc: torch.Tensor  # (B, T) dataset index of the example at each position, -1 on padding
    n_targets: int  # loss-bearing positions
    n_tokens: int  # positions holding an example (the rest is padding)
    one_per_row: bool  # every row holds a single example starting at position 0
    frame: torch.Tensor | None = None  # (B, T) lane-packed examples: frame id within the example
    branch: torch.Tensor | None = None  # (B, T) lane-packed examples: pending call block id, -1 = trunk
    blocks: torch.Tensor | None = None  # (k, 3) (row, start, length) of each example
    attn: object = None  # after `prepare`: the attention backend, on the batch's device

    def to(self, device) -> "PackedBatch":
        """The batch on `device` (from pinned memory, without blocking, on CUDA)."""
        device = torch.device(device)
        move = lambda t: to_device(t, device)  # noqa: E731
        return PackedBatch(move(self.idx), move(self.targets), move(self.pos), move(self.doc), self.n_targets,
                           self.n_tokens, self.one_per_row, move(self.frame), move(self.branch), move(self.blocks))

    def prepare(self, device, kind: str = "blocks") -> "PackedBatch":
        """This (host) batch on `device` with its attention backend, built here on the host and
        moved along: what a training step feeds the model, with nothing left to compute from
        device values."""
        out = self.to(device)
        out.attn = self.attention(kind).to(device)
        return out

    def layout(self) -> Layout:
        """Who sees whom: each example causally within itself (and the lane rule), padding
        after earlier padding."""
        B, T = self.doc.shape
        return Layout.packed(B, T, *self.blocks.unbind(1), self.frame, self.branch)

    def attention(self, kind: str = "blocks"):
        """The attention backend `kind` (`rlmlab.attention.backends.backend`) of this (host)
        batch; move it with `.to(device)`: "blocks" on CPU, "flex" on CUDA, "dense" the reference."""
        return backend(self.layout(), kind)


def collate(ids: np.ndarray, loss: np.ndarray, offsets: np.ndarray, rows: list[Row], pad_id: int,
            layout: np.ndarray | None = None, block_size: int | None = None,
            shift: np.random.Generator | None = None, max_shift: int = 0) -> PackedBatch:
    """Lay out `rows` (all of one length) as tensors; ids/loss/offsets/layout as in `ExampleSet`.
    With `block_size`, a position the model cannot read raises ValueError (here, on the host,
    where positions are assigned, so that the forward pass need not read them back).

    With `shift` and `max_shift` > 0, each example's positions start at an offset drawn from
    `shift`, uniform in 0..min(max_shift, what `block_size` leaves after the example): only the
    position ids move, never which tokens attend to which."""
    T = rows[0].length
    if any(r.length != T for r in rows):
        raise ValueError("a packed batch holds rows of one length")
    B = len(rows)
    ex = np.fromiter((e for r in rows for e in r.examples), dtype=np.int64)
    per_row = np.fromiter((len(r.examples) for r in rows), dtype=np.int64)
    row_of = np.repeat(np.arange(B), per_row)  # (k,) row of each example
    lens = offsets[ex + 1] - offsets[ex] - 1  # (k,) positions per example
    flat_start = np.cumsum(lens) - lens  # start of each example in the batch's concatenation
    first_of_row = np.cumsum(per_row) - per_row
    start_in_row = flat_start - flat_start[first_of_row][row_of]
    if np.any(start_in_row + lens > T):
        raise ValueError("examples overflow their row")
    within = np.arange(int(lens.sum())) - np.repeat(flat_start, lens)  # position inside the example
    src = np.repeat(offsets[ex], lens) + within  # input token in the flat id array
    dst = np.repeat(row_of * T + start_in_row, lens) + within

    idx = np.full(B * T, pad_id, dtype=np.int64)
    targets = np.full(B * T, IGNORE, dtype=np.int64)
    pos = np.zeros(B * T, dtype=np.int64)
    doc = np.full(B * T, -1, dtype=np.int64)
    idx[dst] = ids[src]
    targets[dst] = np.where(loss[src + 1], ids[src + 1].astype(np.int64), IGNORE)
    p = within if layout is None else layout[src, 0]
    if shift is not None and max_shift > 0 and len(lens):
        top = np.maximum.reduceat(p, flat_start)  # (k,) last position of each example
        room = max_shift if block_size is None else np.clip(block_size - 1 - top, 0, max_shift)
        p = p + np.repeat(shift.integers(0, np.asarray(room) + 1, size=len(lens)), lens)
    pos[dst] = p
    if block_size is not None and len(pos) and int(pos.max()) >= block_size:
        raise ValueError(f"position {int(pos.max())} beyond the model's {block_size}")
    doc[dst] = np.repeat(ex, lens)
    as_t = lambda a: torch.from_numpy(a.reshape(B, T))  # noqa: E731
    frame = branch = None
    if layout is not None and len(src) and int(layout[src, 1].max()) >= 0:  # lanes (frame -1: positions only)
        frame = np.full(B * T, -1, dtype=np.int64)
        branch = np.full(B * T, -1, dtype=np.int64)
        frame[dst] = layout[src, 1]
        branch[dst] = layout[src, 2]
        frame, branch = as_t(frame), as_t(branch)
    blocks = torch.from_numpy(np.stack([row_of, start_in_row, lens], axis=1))
    return PackedBatch(as_t(idx), as_t(targets), as_t(pos), as_t(doc), int((targets != IGNORE).sum()),
                       len(within), bool(np.all(per_row == 1)), frame, branch, blocks)


def micro_batches(rows: list[Row], max_tokens: int) -> list[list[Row]]:
    """Group rows by length (shortest first) into chunks of at most `max_tokens` positions
    (at least one row each): one forward/backward pass per chunk."""
    by_len: dict[int, list[Row]] = {}
    for r in rows:
        by_len.setdefault(r.length, []).append(r)
    out = []
    for T in sorted(by_len):
        group = by_len[T]
        per = max(1, max_tokens // T)
        out.extend(group[i:i + per] for i in range(0, len(group), per))
    return out


def flat_micro_batches(rows: list[Row], lengths: np.ndarray, length: int) -> list[Row]:
    """The examples of `rows` (of `lengths` positions each), in order, laid end to end into
    rows of exactly `length` positions (a row's own padding dropped, no example split): the
    fixed-shape micro-batches of the CUDA path, one row each."""
    out: list[Row] = []
    members: list[int] = []
    used = 0
    for r in rows:
        n = int(lengths[list(r.examples)].sum())
        if n > length:
            raise ValueError(f"a row of {n} positions does not fit micro-batches of {length}")
        if used + n > length:
            out.append(Row(length, tuple(members)))
            members, used = [], 0
        members.extend(r.examples)
        used += n
    if members:
        out.append(Row(length, tuple(members)))
    return out


class RowStream:
    """Endless rows over a dataset, epoch after epoch; resumable from `state()`.

    Epoch e packs the examples in the order of a permutation seeded by (seed, e), so the rows
    of any epoch can be rebuilt from the seed alone and the cursor is two integers.
    """

    def __init__(self, lengths: np.ndarray, row_len: int, seed: int, window: int = 2048):
        self.lengths = np.asarray(lengths)
        if len(self.lengths) == 0:
            raise ValueError("no examples to stream")
        self.row_len, self.seed, self.window = row_len, seed, window
        self.epoch, self.cursor = 0, 0
        self._packed: tuple[int, list[Row]] | None = None

    def epoch_rows(self, epoch: int) -> list[Row]:
        """The rows of epoch `epoch`, in the order they are taken (the latest epoch is kept)."""
        if self._packed is None or self._packed[0] != epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.lengths))
            self._packed = (epoch, pack_rows(self.lengths, self.row_len, order, self.window))
        return self._packed[1]

    def take(self, budget: int) -> list[Row]:
        """The next rows, until they hold at least `budget` positions (padding included)."""
        out, got = [], 0
        while got < budget:
            rows = self.epoch_rows(self.epoch)
            if self.cursor == len(rows):
                self.epoch, self.cursor = self.epoch + 1, 0
                continue
            out.append(rows[self.cursor])
            got += rows[self.cursor].length
            self.cursor += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])

"""The KV cache of the decoder: keys and values per slot, with per-slot frame stacks.

Every frame starts at position 0, as in training, so a slot holds its current frame at
positions 0..; a push parks the parent's keys/values on the slot's stack and a pop puts them
back, so a return costs the returned payload only, never the parent's prefix.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class Group(NamedTuple):
    """A span of a forward's flat token row that attends as a batch of its own: `rows` rows of
    `T` tokens each (row-major). With `read` = hi the queries attend over positions [0, hi) of
    their slots' cached frames (`slots` (rows,), or None for slots 0..rows-1 read as views),
    written first; with `read` None the rows are packed new frames attending only among
    themselves. mask (rows, 1, T, hi or T) bool, True = may attend."""

    rows: int
    T: int
    read: int | None
    slots: torch.Tensor | None
    mask: torch.Tensor


class KVCache:
    """Keys and values of `n_slots` rows for every layer, with per-slot frame stacks.

    Layout (2, n_layer, n_slots, n_head, capacity + 1, head_dim): k and v in one tensor so a
    frame is parked or restored with one copy. A slot holds its current frame at positions
    0..; the last time column is scratch, where padding tokens write.

    One forward per decoding step: every token fed this step is one position of a single flat
    row. Before the forward the caller sets a `plan`: where each token's key/value goes and
    the `Group`s the row splits into; `attend` (called by every attention layer in place of
    its own attention) stores the keys/values and attends group by group.
    """

    def __init__(self, n_layer: int, n_slots: int, n_head: int, head_dim: int, capacity: int = 128,
                 dtype=torch.float32, device=None, grow: bool = True):
        self.kv = torch.zeros(2, n_layer, n_slots, n_head, capacity + 1, head_dim, dtype=dtype, device=device)
        self.grow = grow  # False: allocated once at its full size, `reserve` beyond it is an error
        self.parked: list[list[torch.Tensor]] = [[] for _ in range(n_slots)]
        self._plan: tuple = ()

    @property
    def capacity(self) -> int:
        return self.kv.shape[4] - 1

    @property
    def scratch(self) -> int:
        return self.kv.shape[4] - 1

    def reserve(self, n: int) -> None:
        """Make positions [0, n) usable (grow by doubling; the scratch column moves to the end)."""
        if n <= self.capacity:
            return
        if not self.grow:
            raise ValueError(f"{n} positions beyond the cache's {self.capacity}")
        cap = max(n, 2 * self.capacity)
        grown = self.kv.new_zeros(*self.kv.shape[:4], cap + 1, self.kv.shape[5])
        grown[:, :, :, :, :self.capacity] = self.kv[:, :, :, :, :self.capacity]
        self.kv = grown

    def clear(self, slot: int) -> None:
        self.parked[slot].clear()

    def park(self, slot: int, n: int) -> None:
        """A frame is pushed above the slot's current one: keep its first n positions aside."""
        self.parked[slot].append(self.kv[:, :, slot, :, :n].clone())  # (2, L, nh, n, hs)

    def unpark(self, slot: int) -> None:
        """The top frame returned: put the parent's keys/values back where they were."""
        saved = self.parked[slot].pop()
        self.kv[:, :, slot, :, :saved.shape[3]] = saved

    def plan(self, slots: torch.Tensor, pos: torch.Tensor, groups: list[Group]) -> None:
        """slots, pos (N,): where each of the flat row's N tokens stores its key and value."""
        self._plan = (slots, pos, groups)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        slots, pos, groups = self._plan
        _, nh, N, hs = q.shape  # (1, nh, N, hs): one flat row
        K, V = self.kv[0, layer], self.kv[1, layer]  # (n_slots, nh, cap+1, hs)
        K[slots, :, pos] = k[0].transpose(0, 1)  # (N, nh, hs) at per-token (slot, position)
        V[slots, :, pos] = v[0].transpose(0, 1)
        out, start = [], 0
        for g in groups:
            n = g.rows * g.T

            def rows(t):  # (1, nh, N, hs) -> this group's (rows, nh, T, hs)
                return t[0, :, start:start + n].reshape(nh, g.rows, g.T, hs).transpose(0, 1)

            if g.read is None:
                keys, values = rows(k), rows(v)
            elif g.slots is None:
                keys, values = K[:g.rows, :, :g.read], V[:g.rows, :, :g.read]  # views, no copy
            else:
                keys, values = K[g.slots, :, :g.read], V[g.slots, :, :g.read]
            y = F.scaled_dot_product_attention(rows(q), keys, values, attn_mask=g.mask)  # (rows, nh, T, hs)
            out.append(y.transpose(0, 1).reshape(nh, n, hs))
            start += n
        return torch.cat(out, dim=1)[None] if len(out) > 1 else out[0][None]  # (1, nh, N, hs)

"""The decoder's KV cache: the keys and values of every slot's current frame, for every layer.

Every frame starts at position 0, as in training, so a slot holds its current frame at
positions 0..; a push parks the parent's keys/values on the slot's stack and a pop puts them
back, so a return costs the returned payload only, never the parent's prefix.

The cache only stores: what a step's queries read of it is laid out by the decoder
(`rlmlab.decoding.engine`) and attended by the model's attention code
(`rlmlab.attention.backends.Cached`).
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of `n_slots` rows for every layer, with per-slot frame stacks.

    Layout (2, n_layer, n_slots, n_head, capacity + 1, head_dim): k and v in one tensor so a
    frame is parked or restored with one copy. The last time column is scratch: padding
    tokens write there, so that every token of a step's flat row can be stored in one copy.
    """

    def __init__(self, n_layer: int, n_slots: int, n_head: int, head_dim: int, capacity: int = 128,
                 dtype=torch.float32, device=None, grow: bool = True):
        self.kv = torch.zeros(2, n_layer, n_slots, n_head, capacity + 1, head_dim, dtype=dtype, device=device)
        self.grow = grow  # False: allocated once at its full size, `reserve` beyond it is an error
        self.parked: list[list[torch.Tensor]] = [[] for _ in range(n_slots)]

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

    def store(self, layer: int, slots: torch.Tensor, at: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a flat row's keys and values k, v (1, nh, N, hs), token i at position at[i] of
        slot slots[i]; returns the layer's keys and values (n_slots, nh, capacity + 1, hs)."""
        K, V = self.kv[0, layer], self.kv[1, layer]
        K[slots, :, at] = k[0].transpose(0, 1)  # (N, nh, hs) at per-token (slot, position)
        V[slots, :, at] = v[0].transpose(0, 1)
        return K, V

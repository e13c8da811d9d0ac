"""Greedy next tokens from a Transformer, KV-cached: the model side of the decoder, and its
cache (`KVCache`).

Each step is one forward over everything new: one token for most rows, whole frames (packed
end to end) for rows that just pushed one or started.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch

from rlmlab.attention.backends import Cached, Group
from rlmlab.attention.layout import visible
from rlmlab.attention.positions import context_limit
from rlmlab.decoding.predictor import Feed
from rlmlab.learning.observe import NEW, POP, PUSH


class KVCache:
    """Keys and values of `n_slots` rows for every layer, with per-slot frame stacks.

    Every frame starts at position 0, as in training, so a slot holds its current frame at
    positions 0..; a push parks the parent's keys/values on the slot's stack and a pop puts them
    back, so a return costs the returned payload only, never the parent's prefix. The cache only
    stores: what a step's queries read of it is laid out by `ModelPredictor` and attended by
    `rlmlab.attention.backends.Cached`.

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


class ModelPredictor:
    """Greedy next tokens from a Transformer, for any learner (the feeds carry what it reads).

    With `use_cache` each step feeds only what is new, all in one forward. Most rows have one
    new token, which attends to its slot's cached frame. Rows that start a frame (a new
    expression, or an RM push) have the whole frame to read: their tokens are packed end to
    end into rows of about `pack` tokens, each attending only within its own frame. Without
    the cache every step recomputes every row from position 0: the reference the cached path
    is checked against, and the benchmark's baseline.
    `logits` keeps the last step's next-token logits, one row per feed. Inference only: the
    cached path applies no dropout.

    On CUDA the model runs under bf16 autocast, as in training, and the cache is allocated once
    at reset, in bf16, for the model's whole block (2 x 2 x n_layer x n_slots x n_embd bytes per
    position: 4.8 GB for the paper's RM model at 256 slots, 9.7 GB for its CoT model, whose
    block is 4,096; pass `capacity` to bound it); on CPU it is fp32 and grows by
    doubling with the longest row decoded (CoT: the longest trace; RM: the widest frame). Each
    step sends its token layout to the device in one copy (from pinned memory) and reads the
    next tokens back in one.
    """

    default_slots = 64  # rows decoded at once when `generate` is given no batch_size

    def __init__(self, model, use_cache: bool = True, pack: int = 256, capacity: int | None = None):
        self.model = model
        self.cfg = model.cfg
        self.block_size = context_limit(model.cfg)
        self.position_index = getattr(model.cfg, "position_index", None)  # the driver places tokens by it
        self.use_cache = use_cache
        self.pack = pack
        self.device = next(model.parameters()).device
        cuda = self.device.type == "cuda"
        self.dtype = torch.bfloat16 if cuda else next(model.parameters()).dtype
        self.capacity = capacity if capacity is not None else (self.block_size if cuda else None)
        if cuda:
            self.default_slots = 256
        self.cache: KVCache | None = None
        self.fed: list[int] = []
        self.logits: torch.Tensor | None = None

    def reset(self, n_slots: int) -> None:
        c = self.cfg
        if self.use_cache:
            fixed = self.capacity is not None
            self.cache = KVCache(c.n_layer, n_slots, c.n_head, c.n_embd // c.n_head,
                                 capacity=self.capacity if fixed else 128, dtype=self.dtype, device=self.device,
                                 grow=not fixed)
        self.fed = [0] * n_slots

    @torch.no_grad()
    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        with torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda" else nullcontext():
            logits = self._cached(feeds) if self.use_cache else self._recompute(feeds)
        self.logits = logits
        return logits.argmax(-1).tolist()

    def _tensor(self, data) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.long, device=self.device)

    def _recompute(self, feeds: Sequence[Feed]) -> torch.Tensor:
        T = max(len(f.seq) for f in feeds)
        idx = self._tensor([f.seq + [0] * (T - len(f.seq)) for f in feeds])  # (n, T), right-padded
        last = self._tensor([len(f.seq) - 1 for f in feeds])
        pos = None
        if any(f.pos is not None for f in feeds):
            pos = self._tensor([(f.pos if f.pos is not None else list(range(len(f.seq)))) + [0] * (T - len(f.seq))
                                for f in feeds])
        out = self.model(idx, pos)  # causal: a row's real tokens never see its padding
        return out[torch.arange(len(feeds), device=self.device), last]  # (n, V)

    def _cached(self, feeds: Sequence[Feed]) -> torch.Tensor:
        cache, fed = self.cache, self.fed
        # Grow first: the scratch column must stay put while this step's destinations are chosen.
        cache.reserve(max(len(f.seq) for f in feeds))
        one, fresh, more = [], [], []  # (index, feed): one new token / a new frame / several after a kept prefix
        for i, f in enumerate(feeds):
            if f.event == NEW:
                cache.clear(f.slot)
            elif f.event == PUSH:
                cache.park(f.slot, fed[f.slot])
            elif f.event == POP:
                cache.unpark(f.slot)
            if len(f.seq) - f.keep == 1:
                one.append((i, f))
            else:
                (fresh if f.keep == 0 else more).append((i, f))
            fed[f.slot] = len(f.seq)
        flat = _Flat(cache.scratch, len(feeds))
        up = _Upload()
        groups = []
        if one:
            groups.append(self._decode(one, flat, up))
        if more:
            groups.append(self._extend(more, flat, up))
        if fresh:
            groups.append(self._prefill(fresh, flat, up))
        if self.block_size is not None and max(flat.pos) >= self.block_size:  # the driver stops rows first
            raise ValueError(f"position {max(flat.pos)} beyond the model's {self.block_size}")
        fields = [up.add(x) for x in (flat.slots, flat.at, flat.tok, flat.pos, flat.last)]
        sent = up.send(self.device)
        slots, at, tok, pos, last = (sent[f] for f in fields)
        attn = Cached(cache, slots, at, [g(sent) for g in groups])
        out = self.model(tok[None], pos[None], attn)[0]  # (N, V)
        return out[last]  # (n, V)

    def _decode(self, feeds: list[tuple[int, Feed]], flat: "_Flat", up: "_Upload") -> Callable:
        """One new token per row, at position keep of its frame, attending to positions [0, keep]."""
        slots = [f.slot for _, f in feeds]
        span = max(slots) + 1
        hi = max(f.keep for _, f in feeds) + 1
        if 2 * len(feeds) >= span:
            # Run slots 0..span-1 on views of the cache; a slot not decoding this step is a
            # padding row that writes to the scratch column and attends to position 0.
            by_slot = {f.slot: (i, f) for i, f in feeds}
            keep = []
            for s in range(span):
                if s in by_slot:
                    i, f = by_slot[s]
                    flat.add(f.seq[-1], f.keep if f.pos is None else f.pos[-1], s, f.keep, i)
                    keep.append(f.keep)
                else:
                    flat.add(0, 0, s, flat.scratch)
                    keep.append(0)
            read_slots = None
        else:
            # Few rows (the end of a run): gather them rather than run every slot.
            for i, f in feeds:
                flat.add(f.seq[-1], f.keep if f.pos is None else f.pos[-1], f.slot, f.keep, i)
            keep = [f.keep for _, f in feeds]
            read_slots = up.add(slots)
        keep_at = up.add(keep)

        def group(sent) -> Group:
            mask = visible(sent[keep_at][:, None], torch.arange(hi, device=self.device))  # (rows, hi)
            return Group(len(keep), 1, hi, None if read_slots is None else sent[read_slots], mask[:, None, None, :])
        return group

    def _extend(self, feeds: list[tuple[int, Feed]], flat: "_Flat", up: "_Upload") -> Callable:
        """Several new tokens after a kept prefix (a multi-token return payload): rows padded to
        T, reading the prefix back from the cache."""
        T = max(len(f.seq) - f.keep for _, f in feeds)
        hi = max(len(f.seq) for _, f in feeds)
        for i, f in feeds:
            n = len(f.seq)
            for j in range(f.keep, n):
                flat.add(f.seq[j], j if f.pos is None else f.pos[j], f.slot, j, i if j == n - 1 else None)
            for _ in range(T - (n - f.keep)):
                flat.add(0, 0, f.slot, flat.scratch)
        keep_at, slots_at = up.add([f.keep for _, f in feeds]), up.add([f.slot for _, f in feeds])

        def group(sent) -> Group:
            # query t of a row sees positions [0, keep + t]; padding queries see garbage, unused
            limit = sent[keep_at][:, None] + torch.arange(T, device=self.device)  # (rows, T)
            mask = visible(limit[:, :, None], torch.arange(hi, device=self.device))  # (rows, T, hi)
            return Group(len(feeds), T, hi, sent[slots_at], mask[:, None])
        return group

    def _prefill(self, feeds: list[tuple[int, Feed]], flat: "_Flat", up: "_Upload") -> Callable:
        """Whole new frames packed end to end into rows of up to max(pack, longest) tokens; a
        token attends to the tokens before it in its own frame only."""
        width = max(self.pack, max(len(f.seq) for _, f in feeds))
        packs: list[list[tuple[int, Feed]]] = []  # first fit, longest frames first
        used: list[int] = []
        for i, f in sorted(feeds, key=lambda item: -len(item[1].seq)):
            for r in range(len(packs)):
                if used[r] + len(f.seq) <= width:
                    packs[r].append((i, f))
                    used[r] += len(f.seq)
                    break
            else:
                packs.append([(i, f)])
                used.append(len(f.seq))
        T = max(used)
        seg = []  # per packed token: which frame of its row (-1: padding)
        for members, n_used in zip(packs, used):
            for k, (i, f) in enumerate(members):
                n = len(f.seq)
                for j in range(n):
                    flat.add(f.seq[j], j if f.pos is None else f.pos[j], f.slot, j, i if j == n - 1 else None)
                seg += [k] * n
            for _ in range(T - n_used):
                flat.add(0, 0, members[0][1].slot, flat.scratch)
            seg += [-1] * (T - n_used)
        seg_at = up.add(seg)

        def group(sent) -> Group:
            seg_t = sent[seg_at].view(len(packs), T)
            t = torch.arange(T, device=self.device)
            mask = visible(t[:, None], t[None, :], seg_t[:, :, None], seg_t[:, None, :])  # (rows, T, T)
            return Group(len(packs), T, None, None, mask[:, None])
        return group


class _Upload:
    """Integer lists a decoding step needs on the device, sent in one copy: `add` each list
    (its handle back), `send` once, then index the result with the handles."""

    __slots__ = ("parts", "sizes")

    def __init__(self):
        self.parts: list[int] = []
        self.sizes: list[int] = []

    def add(self, values: list[int]) -> int:
        self.parts.extend(values)
        self.sizes.append(len(values))
        return len(self.sizes) - 1

    def send(self, device: torch.device) -> list[torch.Tensor]:
        t = torch.tensor(self.parts, dtype=torch.long)
        if device.type == "cuda":
            t = t.pin_memory().to(device, non_blocking=True)
        return list(t.to(device).split(self.sizes))


class _Flat:
    """The one flat row a cached step feeds: token, position in its frame, where its key/value
    goes, and for each feed the index whose logits predict its next token."""

    __slots__ = ("tok", "pos", "slots", "at", "last", "scratch")

    def __init__(self, scratch: int, n_feeds: int):
        self.tok: list[int] = []
        self.pos: list[int] = []
        self.slots: list[int] = []
        self.at: list[int] = []
        self.last = [0] * n_feeds
        self.scratch = scratch

    def add(self, tok: int, pos: int, slot: int, at: int, last_of: int | None = None) -> None:
        """One token; `last_of`: the feed whose next token this token's logits predict."""
        if last_of is not None:
            self.last[last_of] = len(self.tok)
        self.tok.append(tok)
        self.pos.append(pos)
        self.slots.append(slot)
        self.at.append(at)

"""Greedy decoding for every learner: one driver, any observation function.

`generate(predictor, exprs, vocab, learner)` runs many expressions at once. Each expression is a
*row*: its flattened trace grows one token per step, and a `StackReplay` keeps the frame
stack, decides legality and notices when the root's return block closes. What the row shows
the predictor is the learner's observation of that trace:

- CoT: the whole flattened trace so far;
- RM: the active (top) frame only. On `</call>` the payload q becomes a new frame; on
  `</return>` with a parent below, the frame is popped and its payload appended to the parent.
- any other observation of `rlmlab.learning.observe` ("window:K", "reduce"): its `Tracker` says how
  the observation and the reusable cache prefix (`Feed.keep`) change on each token.

A *predictor* maps a batch of rows to next-token ids. Two kinds share the interface:
`ModelPredictor` (a Transformer, with or without a KV cache) and `Oracle` (the true rule g*,
computed from the active frame alone). `OnActiveFrame` composes a frame predictor with the
active-frame map Pi_rec so it can run in the CoT decoder, and `TeacherForced` runs one
predictor while following another's tokens (logit checks, speed measurements on the true
trace lengths).

Rows live in a fixed number of *slots* (continuous batching: a finished row's slot takes the
next expression at once). The KV cache keeps one row of keys/values per slot holding the
slot's current frame at positions 0.. (every frame starts at position 0, as in training); a
push parks the parent's keys/values on a per-slot stack and a pop puts them back, so a return
costs the returned payload only, never the parent's prefix. Each step is one forward over
everything new: one token for most rows, whole frames (packed end to end) for rows that just
pushed one or started.

Whatever a predictor emits, the driver does not raise: an illegal token, a special token, a
stack deeper than the limit, a frame or trace longer than the model can read or longer than
the limits ends that row as invalid with the reason, and the other rows go on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F

from rlmlab.learning.observe import NEW, POP, PUSH, Tracker, observer
from rlmlab.learning.positions import alibi_bias, alibi_slopes, biased, context_limit
from rlmlab.task.expr import Call, default_library, parse, to_text
from rlmlab.task.expr import tokens as expr_tokens
from rlmlab.task.frames import StackReplay, active_frame
from rlmlab.task.trace import execute, trace_stats
from rlmlab.task.vocab import Vocab

NO_TOKEN = -1  # a predictor's "I have no next token" (the oracle off the canonical path)


class Feed(NamedTuple):
    """What a predictor sees of one row this step."""

    slot: int  # the row's slot: stable for the row's lifetime, reused by the next row
    seq: list[int]  # the observation: CoT the trace so far, RM the active frame, ... (read-only)
    keep: int  # leading tokens of seq already fed to this slot's current frame and still valid
    event: str | None  # NEW row in the slot, PUSH of a new frame, POP back to the parent, or None


class Predictor(Protocol):
    block_size: int | None  # longest seq it can read (None: unbounded)

    def reset(self, n_slots: int) -> None: ...

    def __call__(self, feeds: Sequence[Feed]) -> list[int]: ...


# --- KV cache -----------------------------------------------------------------------------


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


# --- predictors ---------------------------------------------------------------------------


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
        out = self.model(idx)  # causal: a row's real tokens never see its padding
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
        groups = [g(sent) for g in groups]
        if self.cfg.positions == "alibi":
            groups = self._alibi(groups, pos)
        cache.plan(slots, at, groups)
        out = self.model(tok[None], pos[None], None, cache)[0]  # (N, V)
        return out[last]  # (n, V)

    def _alibi(self, groups: list[Group], pos: torch.Tensor) -> list[Group]:
        """The groups' masks with ALiBi's bias: a query's position is its token's, a key read from
        the cache sits at its column (a slot holds its frame at positions 0..), a packed new
        frame's key at its token's position."""
        slopes = alibi_slopes(self.cfg.n_head, self.device)
        out, start = [], 0
        for g in groups:
            pos_q = pos[start:start + g.rows * g.T].view(g.rows, g.T)
            pos_k = pos_q if g.read is None else torch.arange(g.read, device=self.device).expand(g.rows, g.read)
            out.append(g._replace(mask=biased(g.mask, alibi_bias(slopes, pos_q, pos_k)).to(self.dtype)))
            start += g.rows * g.T
        return out

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
                    flat.add(f.seq[-1], f.keep, s, f.keep, i)
                    keep.append(f.keep)
                else:
                    flat.add(0, 0, s, flat.scratch)
                    keep.append(0)
            read_slots = None
        else:
            # Few rows (the end of a run): gather them rather than run every slot.
            for i, f in feeds:
                flat.add(f.seq[-1], f.keep, f.slot, f.keep, i)
            keep = [f.keep for _, f in feeds]
            read_slots = up.add(slots)
        keep_at = up.add(keep)

        def group(sent) -> Group:
            mask = torch.arange(hi, device=self.device) <= sent[keep_at][:, None]  # (rows, hi)
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
                flat.add(f.seq[j], j, f.slot, j, i if j == n - 1 else None)
            for _ in range(T - (n - f.keep)):
                flat.add(0, 0, f.slot, flat.scratch)
        keep_at, slots_at = up.add([f.keep for _, f in feeds]), up.add([f.slot for _, f in feeds])

        def group(sent) -> Group:
            # query t of a row sees positions [0, keep + t]; padding queries see garbage, unused
            limit = sent[keep_at][:, None] + torch.arange(T, device=self.device)  # (rows, T)
            mask = torch.arange(hi, device=self.device) <= limit[:, :, None]  # (rows, T, hi)
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
                    flat.add(f.seq[j], j, f.slot, j, i if j == n - 1 else None)
                seg += [k] * n
            for _ in range(T - n_used):
                flat.add(0, 0, members[0][1].slot, flat.scratch)
            seg += [-1] * (T - n_used)
        seg_at = up.add(seg)

        def group(sent) -> Group:
            seg_t = sent[seg_at].view(len(packs), T)
            causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
            mask = (seg_t[:, :, None] == seg_t[:, None, :]) & causal  # (rows, T, T)
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


class _Match:
    """The examples of one frame's call that agree with the frame's first `n` tokens, in
    execution order: the next token is the next target of the first whose targets reach past `n`."""

    __slots__ = ("examples", "n")

    def __init__(self, examples: list[tuple[int, tuple[int, ...]]], frame: Sequence[int]):
        n = len(frame)
        head = tuple(frame)
        self.examples = [(m, toks) for m, toks in examples if len(toks) >= n and toks[:n] == head]
        self.n = n

    def extend(self, frame: Sequence[int]) -> None:
        """The frame grew by tokens appended after the first `n`."""
        n, new = self.n, tuple(frame[self.n:])
        end = n + len(new)
        self.examples = [(m, toks) for m, toks in self.examples if len(toks) >= end and toks[n:end] == new]
        self.n = end

    def next_id(self) -> int:
        n = self.n
        for m, toks in self.examples:
            if m <= n < len(toks):
                return toks[n]
        return NO_TOKEN


class Oracle:
    """The true next-token rule g* as a function of the active frame alone (an RM predictor).

    A frame starts with the written call q it evaluates. Executing q gives every active-frame
    example of q's frame (and, in passing, of every frame below it); the frame seen now is one
    of those examples' context plus a prefix of its targets, and the next token is the next
    target. Tables are built per distinct q on first sight. A frame that is not on q's
    canonical path (only a wrong predictor produces one) gets NO_TOKEN.
    """

    block_size = None

    def __init__(self, vocab: Vocab, library=None, max_calls: int = 200_000):
        self.vocab = vocab
        self.library = library
        self.max_calls = max_calls
        self.open_id, self.close_id = vocab.ids["("], vocab.ids[")"]
        # A written call has only function names, literals, parentheses and commas, and its
        # frame continues with a parameter name or `return`: with byte-sized ids the call's
        # extent is one C-level regex match rather than a Python loop over it every step.
        library = self.library or default_library()
        call_ids = [i for i, t in enumerate(vocab.tokens)
                    if t in ("(", ")", ",") or t in library.literals or t in library]
        self.call_re = re.compile(b"[" + re.escape(bytes(call_ids)) + b"]*") if len(vocab) <= 256 else None
        # q (ids) -> [(m, example tokens)] for q's own frame, in execution order
        self.table: dict[tuple[int, ...], list[tuple[int, tuple[int, ...]]]] = {}
        self.frames: list[list[_Match | None]] = []  # per slot, its frames' matches, innermost last

    def reset(self, n_slots: int) -> None:
        """Forget the rows' frames (the tables only grow)."""
        self.frames = [[] for _ in range(n_slots)]

    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        return [self.step(f) for f in feeds]

    def step(self, f: Feed) -> int:
        """`next_id` of the feed's frame, kept per slot as the examples that still agree with
        it: a step that only appends tokens checks those against each example, so a frame of
        L tokens costs O(L) over its life rather than O(L) per step (O(L^2) for the root frame
        of a long expression). A parent frame is kept aside while its child runs, as the KV
        cache does, and re-matched when the child returns (the frame lost its call block)."""
        if f.slot >= len(self.frames):
            self.frames.extend([] for _ in range(f.slot + 1 - len(self.frames)))
        stack = self.frames[f.slot]
        if f.event == NEW:
            stack.clear()
        elif f.event == POP and stack:
            stack.pop()
        if f.event in (NEW, PUSH) or not stack:
            stack.append(None)
        match = stack[-1]
        seq = f.seq
        if match is None or f.keep < match.n or f.keep > len(seq):
            match = stack[-1] = self._match(seq)
        elif match.n < len(seq):
            match.extend(seq)
        return match.next_id()

    def _match(self, frame: Sequence[int]) -> "_Match":
        n = self._call_len(frame)
        if n is None:
            return _Match([], frame)
        q = tuple(frame[:n])
        examples = self.table.get(q)
        if examples is None:
            examples = self._learn(q)
        return _Match(examples, frame)

    def _call_len(self, frame: Sequence[int]) -> int | None:
        """Length of the written call that opens a frame (if the frame is well-formed, which
        the lookup checks by parsing it)."""
        if self.call_re is not None:
            return self.call_re.match(bytes(frame)).end() or None
        depth = 0
        for i, t in enumerate(frame):
            if t == self.open_id:
                depth += 1
            elif t == self.close_id:
                depth -= 1
                if depth == 0:
                    return i + 1
        return None

    def next_id(self, frame: tuple[int, ...]) -> int:
        n = self._call_len(frame)
        if n is None:
            return NO_TOKEN
        q = frame[:n]
        examples = self.table.get(q)
        if examples is None:
            examples = self._learn(q)
        n = len(frame)
        for m, toks in examples:
            if m <= n < len(toks) and toks[:n] == frame:
                return toks[n]
        return NO_TOKEN

    def _learn(self, q: tuple[int, ...]) -> list[tuple[int, tuple[int, ...]]]:
        if len(self.table) > self.max_calls:
            self.table.clear()  # bound memory on long runs; tables are rebuilt on demand
        try:
            ex = execute(parse(" ".join(self.vocab.decode(q)), self.library), self.library)
        except Exception:  # noqa: BLE001 - not a well-formed call: no rule applies
            self.table[q] = []
            return []
        by_call: dict[tuple[int, ...], list] = {}
        for f in ex.frames:
            toks = tuple(self.vocab.encode(f.tokens))
            fq = toks[:self._call_len(toks)]
            if fq not in self.table:
                by_call.setdefault(fq, []).append((f.m, toks))
        for fq, examples in by_call.items():
            # A call repeated in the tree contributes its (identical) examples once.
            self.table[fq] = list(dict.fromkeys(examples))
        return self.table[q]


class OnActiveFrame:
    """A frame predictor run on whole traces: g o Pi_rec, a CoT predictor.

    Pi_rec is kept incrementally per slot with `StackReplay` (equal to `active_frame` on legal
    prefixes, tested in test_trace_properties); on an illegal prefix it falls back to
    `active_frame` itself, which is total. `frame` is a function of the frame's ids alone
    (each frame seen afresh), or an RM predictor fed the frame as the RM decoder would feed it:
    tokens appended to the same frame as such, a frame changed by a call or a return anew.
    """

    block_size = None

    def __init__(self, frame: Callable[[tuple[int, ...]], int] | Predictor, vocab: Vocab):
        self.inner = frame if hasattr(frame, "reset") else _EachFrame(frame)
        self.vocab = vocab
        self.replays: list[StackReplay | None] = []
        self.seen: list[int] = []
        self.frames: list[list[int]] = []  # per slot, the active frame's ids

    def reset(self, n_slots: int) -> None:
        self.replays = [None] * n_slots
        self.seen = [0] * n_slots
        self.frames = [[] for _ in range(n_slots)]
        self.inner.reset(n_slots)

    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        toks, ids = self.vocab.tokens, self.vocab.ids
        inner = []
        for f in feeds:
            r = self.replays[f.slot]
            fresh = r is None or f.event == NEW or f.keep < self.seen[f.slot]
            if fresh:
                r = self.replays[f.slot] = StackReplay()
                self.seen[f.slot] = 0
            new = f.seq[self.seen[f.slot]:]
            events = [r.feed(toks[t]) for t in new]
            moved = fresh or any(e is not None for e in events)  # a push, a pop or an error
            self.seen[f.slot] = len(f.seq)
            frame = self.frames[f.slot]
            if moved:
                top = r.top if r.error is None else active_frame(toks[t] for t in f.seq)
                frame[:] = map(ids.__getitem__, top)
                inner.append(Feed(f.slot, frame, 0, NEW))
            else:  # the tokens went onto the same frame
                keep = len(frame)
                frame.extend(new)
                inner.append(Feed(f.slot, frame, keep, None))
        return self.inner(inner)


class _EachFrame:
    """A function of the frame's ids as a predictor."""

    block_size = None

    def __init__(self, fn: Callable[[tuple[int, ...]], int]):
        self.fn = fn

    def reset(self, n_slots: int) -> None:
        pass

    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        return [self.fn(tuple(f.seq)) for f in feeds]


def oracle_predictor(learner: str, vocab: Vocab, library=None) -> Predictor:
    """The oracle for a learner: g* on the active frame (RM), or g* o Pi_rec of whatever the learner
    shows (CoT, reduction: Pi_rec of the observation is Pi_rec of the trace, so it reproduces
    canonical traces; a window shorter than the trace hides the frame's start, so there it is
    g* o Pi_rec of the window, not the true rule)."""
    oracle = Oracle(vocab, library)
    return oracle if observer(learner).shows_active_frame else OnActiveFrame(oracle, vocab)


class TeacherForced:
    """Runs `predictor` at every step (its caches, its `logits`) but emits `guide`'s tokens.

    With the oracle as guide, a model is driven along the canonical trace: its logits can be
    compared step by step, and its speed measured on the true trace lengths."""

    def __init__(self, predictor: Predictor, guide: Predictor):
        self.predictor, self.guide = predictor, guide
        self.block_size = predictor.block_size

    def reset(self, n_slots: int) -> None:
        self.predictor.reset(n_slots)
        self.guide.reset(n_slots)

    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        self.predictor(feeds)
        return self.guide(feeds)


# --- the driver ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """When a row stops as invalid. Apply to the produced trace whatever the learner, so that the
    two learners' outputs end for the same reasons."""

    max_depth: int = 64
    """Frames on the stack (the root is depth 1); the paper's generator reaches about 23."""
    max_frame_tokens: int | None = None
    """Tokens of the active frame, visible plus generated (None: no limit beyond what the
    predictor can read, its block size)."""
    max_new_tokens: int | None = None
    """Generated trace tokens. None: scaled to each expression, `RUNAWAY_FACTOR` times the tokens
    its canonical trace generates plus `RUNAWAY_SLACK`, so that a model that never closes the
    root stops after a few times the work a right answer takes (the driver writes the flattened
    trace whatever the learner, so the bound is the same for RM and CoT)."""


RUNAWAY_FACTOR, RUNAWAY_SLACK = 8, 64


@dataclass
class Generation:
    """One expression's decoding outcome."""

    expr: str
    tokens: list[str]  # the flattened trace produced, written expression first; an invalid row
    # ends with the token that stopped it (an id outside the vocabulary shows as "<id N>")
    prompt_len: int
    answer: str | None  # the root's returned payload, space-joined, if the root returned
    valid: bool
    reason: str | None  # why the row stopped as invalid
    max_depth: int
    n_frame_examples: int  # active-frame examples cut (= frames of the paper's table on a full trace)
    fed: int  # tokens the predictor was fed (prefills included): the decoding cost

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.prompt_len


class _Row:
    __slots__ = ("i", "slot", "text", "replay", "prompt", "out", "obs", "fed", "cap")

    def __init__(self, i: int, slot: int, expr: Call, vocab: Vocab, obs, cap: int | None, library=None):
        prompt = expr_tokens(expr)
        self.i, self.slot, self.text = i, slot, to_text(expr)
        self.cap = cap if cap is not None else (
            RUNAWAY_FACTOR * (trace_stats(expr, library).trace_len - len(prompt)) + RUNAWAY_SLACK)
        self.replay = StackReplay(prompt)
        self.prompt = prompt
        self.out: list[int] = []  # generated ids
        self.obs: Tracker = obs.tracker(vocab.encode(prompt), vocab)  # seq, keep, event of the observation
        self.fed = 0


def generate(predictor: Predictor, exprs: Sequence[str | Call], vocab: Vocab, learner: str,
             limits: Limits = Limits(), batch_size: int | None = None,
             progress: Callable[[int], None] | None = None, longest_first: bool = True,
             library=None) -> list[Generation]:
    """Greedy-decode every expression as `learner` reads it, `batch_size` rows at a time (default: the
    predictor's `default_slots`, 256 for a model on CUDA, else 64); results in input order.

    `exprs` are written expressions (text or parsed) of `library`'s task (default: the paper's);
    `progress(k)` is called as k rows finish.
    With `longest_first` the expressions with the longest canonical traces enter the slots
    first: rows are independent, so this changes no result, only shortens the run's tail (a
    long trace started last would decode alone at the end).
    """
    obs = observer(learner)
    calls = [e if isinstance(e, Call) else parse(e, library) for e in exprs]
    order = list(range(len(calls)))
    if longest_first:
        order.sort(key=lambda i: -trace_stats(calls[i], library).trace_len)
    block = predictor.block_size
    max_frame = limits.max_frame_tokens
    toks = vocab.tokens
    n_vocab = len(toks)
    results: list[Generation | None] = [None] * len(exprs)
    todo = iter(order)
    if batch_size is None:
        batch_size = getattr(predictor, "default_slots", 64)
    n_slots = max(1, min(batch_size, len(exprs)))
    slots: list[_Row | None] = [None] * n_slots
    predictor.reset(n_slots)

    def finish(row: _Row, reason: str | None) -> None:
        r = row.replay
        trace = row.prompt + [toks[t] if 0 <= t < n_vocab else f"<id {t}>" for t in row.out]
        answer = " ".join(r.answer) if reason is None and r.answer is not None else None
        results[row.i] = Generation(row.text, trace, len(row.prompt), answer, reason is None,
                                    reason, r.max_depth, len(r.examples), row.fed)
        slots[row.slot] = None

    def advance(row: _Row, t: int) -> str | None:
        """Append the predicted token; returns why the row stops, "" when it is done, else None."""
        row.out.append(t)
        if not 0 <= t < n_vocab:
            return "predictor returned no token" if t == NO_TOKEN else f"token id {t} outside the vocabulary"
        r = row.replay
        event = r.feed(toks[t])
        if event == "error":
            return r.error
        if event == "done":
            return ""
        if len(row.out) > row.cap:
            return f"more than {row.cap} generated tokens"
        if event == "push" and r.depth > limits.max_depth:
            return f"deeper than {limits.max_depth} frames"
        if max_frame is not None and len(r.top) > max_frame:
            return f"active frame longer than {max_frame} tokens"
        row.obs.advance(t, event, r)
        return None

    while True:
        for s in range(n_slots):
            if slots[s] is None:
                i = next(todo, None)
                if i is None:
                    break
                slots[s] = _Row(i, s, calls[i], vocab, obs, limits.max_new_tokens, library)
        live = [row for row in slots if row is not None]
        if not live:
            break
        done = 0
        feeds = []
        for row in live:
            o = row.obs
            if block is not None and len(o.seq) > block:
                finish(row, f"{obs.context_word} of {len(o.seq)} tokens exceeds the model's block size {block}")
                done += 1
                continue
            feeds.append(Feed(row.slot, o.seq, o.keep, o.event))
            row.fed += len(o.seq) - o.keep
        if feeds:
            for f, t in zip(feeds, predictor(feeds)):
                row = slots[f.slot]
                stop = advance(row, t)
                if stop is not None:
                    finish(row, stop or None)
                    done += 1
        if progress is not None and done:
            progress(done)
    return results

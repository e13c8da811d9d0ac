"""Greedy decoding for both learners: one driver, two observation functions.

`generate(predictor, exprs, vocab, view)` runs many expressions at once. Each expression is a
*row*: its flattened trace grows one token per step, and a `StackReplay` keeps the frame
stack, decides legality and notices when the root's return block closes. What the row shows
the predictor is the view's observation of that trace:

- CoT: the whole flattened trace so far;
- RM: the active (top) frame only. On `</call>` the payload q becomes a new frame; on
  `</return>` with a parent below, the frame is popped and its payload appended to the parent.

A *predictor* maps a batch of rows to next-token ids. Two kinds share the interface:
`ModelPredictor` (a Transformer, with or without a KV cache) and `Oracle` (the true rule g*,
computed from the active frame alone). `OnActiveFrame` composes a frame predictor with the
active-frame map Pi_rec so it can run in the CoT decoder, and `TeacherForced` runs one
predictor while following another's tokens (logit checks, speed measurements on the true
trace lengths).

Rows live in a fixed number of *slots* (continuous batching: a finished row's slot takes the
next expression at once). The KV cache keeps one row of keys/values per slot holding the
slot's current frame at positions 0.. (RM frames start at position 0, as in training); a push
parks the parent's keys/values on a per-slot stack and a pop puts them back, so a return
costs the returned payload only, never the parent's prefix.

Whatever a predictor emits, the driver does not raise: an illegal token, a special token, a
stack deeper than the limit, a frame or trace longer than the model can read or longer than
the limits ends that row as invalid with the reason, and the other rows go on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from rlmlab.expr import LITERALS, Call, default_library, parse, to_text, tokens as expr_tokens
from rlmlab.frames import StackReplay, active_frame
from rlmlab.trace import execute, trace_stats
from rlmlab.vocab import Vocab

VIEWS = ("cot", "rm")
NO_TOKEN = -1  # a predictor's "I have no next token" (the oracle off the canonical path)

# Frame events a feed carries, so that a cache can follow the row's frame stack.
NEW, PUSH, POP = "new", "push", "pop"


class Feed(NamedTuple):
    """What a predictor sees of one row this step."""

    slot: int  # the row's slot: stable for the row's lifetime, reused by the next row
    seq: list[int]  # the observation: CoT the trace so far, RM the active frame (read-only)
    keep: int  # leading tokens of seq already fed to this slot's current frame and still valid
    event: str | None  # NEW row in the slot, PUSH of a new frame, POP back to the parent, or None


class Predictor(Protocol):
    block_size: int | None  # longest seq it can read (None: unbounded)

    def reset(self, n_slots: int) -> None: ...

    def __call__(self, feeds: Sequence[Feed]) -> list[int]: ...


# --- KV cache -----------------------------------------------------------------------------


class KVCache:
    """Keys and values of `n_slots` rows for every layer, with per-slot frame stacks.

    Layout (2, n_layer, n_slots, n_head, capacity + 1, head_dim): k and v in one tensor so a
    frame is parked or restored with one copy. The last time column is scratch: padding
    tokens write there, never over live entries.

    Before each forward the caller sets a `plan`: where each new key goes, and what the
    attention reads back. `update` (called by every attention layer) writes this forward's
    keys/values and returns what to attend over.
    """

    def __init__(self, n_layer: int, n_slots: int, n_head: int, head_dim: int, capacity: int = 128,
                 dtype=torch.float32, device=None):
        self.kv = torch.zeros(2, n_layer, n_slots, n_head, capacity + 1, head_dim, dtype=dtype, device=device)
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

    def plan(self, slots: torch.Tensor, pos: torch.Tensor, read: int | None = None,
             rows: torch.Tensor | None = None) -> None:
        """slots, pos: (b*T,) where each new key goes, batch rows then time (pos = `scratch` for
        padding). read None: attend over this forward's keys only (fresh frames). read = hi:
        attend over positions [0, hi) of `rows` (b,) after writing, or of slots 0..b-1 if rows
        is None (a view, no copy); the caller's mask picks what each query sees."""
        self._plan = (slots, pos, read, rows)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slots, pos, read, rows = self._plan
        b, nh, T, hs = k.shape
        K, V = self.kv[0, layer], self.kv[1, layer]  # (n_slots, nh, cap+1, hs)
        K[slots, :, pos] = k.transpose(1, 2).reshape(b * T, nh, hs)
        V[slots, :, pos] = v.transpose(1, 2).reshape(b * T, nh, hs)
        if read is None:
            return k, v
        if rows is None:
            return K[:b, :, :read], V[:b, :, :read]  # (b, nh, hi, hs) views
        return K[rows, :, :read], V[rows, :, :read]


# --- predictors ---------------------------------------------------------------------------


class ModelPredictor:
    """Greedy next tokens from a Transformer, for either view (the feeds carry the view).

    With `use_cache` each step feeds only what is new. Most rows have one new token: one
    forward over all slots, each attending to its own cached frame. Rows that start a frame
    (a new expression, or an RM push) have the whole frame to read: these are packed, end
    to end, into rows of about `pack` tokens for a second forward, each attending only
    within its own frame. Without the cache every step recomputes every row from position 0:
    the reference the cached path is checked against, and the benchmark's baseline.
    `logits` keeps the last step's next-token logits, one row per feed.
    """

    def __init__(self, model, use_cache: bool = True, pack: int = 256):
        self.model = model
        self.cfg = model.cfg
        self.block_size = model.cfg.block_size
        self.use_cache = use_cache
        self.pack = pack
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache: KVCache | None = None
        self.fed: list[int] = []
        self.logits: torch.Tensor | None = None

    def reset(self, n_slots: int) -> None:
        c = self.cfg
        if self.use_cache:
            self.cache = KVCache(c.n_layer, n_slots, c.n_head, c.n_embd // c.n_head,
                                 dtype=self.dtype, device=self.device)
        self.fed = [0] * n_slots

    @torch.no_grad()
    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
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
        one, fresh, more = [], [], []  # feed indices: one new token / a new frame / several after a kept prefix
        for i, f in enumerate(feeds):
            if f.event == NEW:
                cache.clear(f.slot)
            elif f.event == PUSH:
                cache.park(f.slot, fed[f.slot])
            elif f.event == POP:
                cache.unpark(f.slot)
            if len(f.seq) - f.keep == 1:
                one.append(i)
            else:
                (fresh if f.keep == 0 else more).append(i)
            fed[f.slot] = len(f.seq)
        logits = torch.empty(len(feeds), self.cfg.vocab_size, dtype=self.dtype, device=self.device)
        if fresh:
            logits[fresh] = self._prefill([feeds[i] for i in fresh])
        if more:
            logits[more] = self._extend([feeds[i] for i in more])
        if one:
            logits[one] = self._decode([feeds[i] for i in one])
        return logits

    def _decode(self, feeds: list[Feed]) -> torch.Tensor:
        """One new token per row at position keep, attending to its frame's positions [0, keep]."""
        cache = self.cache
        slots = [f.slot for f in feeds]
        span = max(slots) + 1
        hi = max(f.keep for f in feeds) + 1
        cache.reserve(hi)
        if 2 * len(feeds) >= span:
            # Run slots 0..span-1 on views of the cache; slots not decoding this step are padding
            # that writes to the scratch column and attends to position 0.
            tok, at, keep = [0] * span, [cache.scratch] * span, [0] * span
            for f in feeds:
                tok[f.slot], at[f.slot], keep[f.slot] = f.seq[-1], f.keep, f.keep
            write, rows, pick = list(range(span)), None, self._tensor(slots)
        else:
            # Few rows (the end of a run): gather them rather than run every slot.
            tok = [f.seq[-1] for f in feeds]
            at = keep = [f.keep for f in feeds]
            write = slots
            rows, pick = self._tensor(slots), None
        idx = self._tensor(tok)[:, None]  # (b, 1)
        pos = self._tensor(keep)[:, None]  # (b, 1): a frame's tokens start at position 0
        mask = torch.arange(hi, device=self.device) <= pos  # (b, hi)
        cache.plan(self._tensor(write), self._tensor(at), hi, rows)
        out = self.model(idx, pos, mask[:, None, None, :], cache)[:, 0]  # (b, V)
        return out if pick is None else out[pick]

    def _prefill(self, feeds: list[Feed]) -> torch.Tensor:
        """Whole new frames, packed end to end into rows of up to max(pack, longest) tokens;
        a token attends to the tokens before it in its own frame only."""
        cache = self.cache
        width = max(self.pack, max(len(f.seq) for f in feeds))
        cache.reserve(width)
        packs: list[list[int]] = []  # feed indices per packed row
        used: list[int] = []
        for i in sorted(range(len(feeds)), key=lambda i: -len(feeds[i].seq)):
            n = len(feeds[i].seq)
            for r in range(len(packs)):  # first fit, longest frames first
                if used[r] + n <= width:
                    packs[r].append(i)
                    used[r] += n
                    break
            else:
                packs.append([i])
                used.append(n)
        T = max(used)
        tok, pos, seg, slots, at = [], [], [], [], []
        last = [0] * len(feeds)
        for r, members in enumerate(packs):
            for i in members:
                f = feeds[i]
                n = len(f.seq)
                last[i] = len(tok) + n - 1  # flat index of the frame's last token
                tok += f.seq
                pos += range(n)
                seg += [i] * n
                slots += [f.slot] * n
                at += range(n)
            pad = (r + 1) * T - len(tok)
            tok += [0] * pad
            pos += [0] * pad
            seg += [-1] * pad
            slots += [feeds[members[0]].slot] * pad
            at += [cache.scratch] * pad
        seg_t = self._tensor(seg).view(len(packs), T)
        causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
        mask = (seg_t[:, :, None] == seg_t[:, None, :]) & causal  # (rows, T, T)
        cache.plan(self._tensor(slots), self._tensor(at))
        out = self.model(self._tensor(tok).view(-1, T), self._tensor(pos).view(-1, T), mask[:, None], cache)
        return out.view(-1, out.shape[-1])[self._tensor(last)]  # (b, V)

    def _extend(self, feeds: list[Feed]) -> torch.Tensor:
        """Several new tokens after a kept prefix (a multi-token return payload): right-padded
        to T, reading the prefix back from the cache."""
        cache = self.cache
        n_new = [len(f.seq) - f.keep for f in feeds]
        T = max(n_new)
        hi = max(len(f.seq) for f in feeds)
        cache.reserve(hi)
        tok, pos, slots, at = [], [], [], []
        for f, n in zip(feeds, n_new):
            pad = T - n
            tok.append(f.seq[f.keep:] + [0] * pad)
            pos.append(list(range(f.keep, len(f.seq))) + [0] * pad)
            slots += [f.slot] * T
            at += list(range(f.keep, len(f.seq))) + [cache.scratch] * pad
        keep = self._tensor([f.keep for f in feeds])
        # query t of a row sees positions [0, keep + t]; padding queries see garbage, unused
        limit = keep[:, None] + torch.arange(T, device=self.device)  # (b, T)
        mask = torch.arange(hi, device=self.device) <= limit[:, :, None]  # (b, T, hi)
        cache.plan(self._tensor(slots), self._tensor(at), hi, self._tensor([f.slot for f in feeds]))
        out = self.model(self._tensor(tok), self._tensor(pos), mask[:, None], cache)
        last = self._tensor(n_new) - 1
        return out[torch.arange(len(feeds), device=self.device), last]  # (b, V)


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
        call_ids = [i for i, t in enumerate(vocab.tokens)
                    if t in ("(", ")", ",") or t in LITERALS or t in (self.library or default_library())]
        self.call_re = re.compile(b"[" + re.escape(bytes(call_ids)) + b"]*") if len(vocab) <= 256 else None
        # q (ids) -> [(m, example tokens)] for q's own frame, in execution order
        self.table: dict[tuple[int, ...], list[tuple[int, tuple[int, ...]]]] = {}

    def reset(self, n_slots: int) -> None:
        pass

    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        return [self.next_id(tuple(f.seq)) for f in feeds]

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
    `active_frame` itself, which is total. The inner function sees each frame afresh, so this
    is for cache-free frame rules such as the oracle.
    """

    block_size = None

    def __init__(self, frame_fn: Callable[[tuple[int, ...]], int], vocab: Vocab):
        self.frame_fn = frame_fn
        self.vocab = vocab
        self.replays: list[StackReplay | None] = []
        self.seen: list[int] = []

    def reset(self, n_slots: int) -> None:
        self.replays = [None] * n_slots
        self.seen = [0] * n_slots

    def __call__(self, feeds: Sequence[Feed]) -> list[int]:
        toks, ids = self.vocab.tokens, self.vocab.ids
        out = []
        for f in feeds:
            r = self.replays[f.slot]
            if r is None or f.event == NEW or f.keep < self.seen[f.slot]:
                r = self.replays[f.slot] = StackReplay()
                self.seen[f.slot] = 0
            for t in f.seq[self.seen[f.slot]:]:
                r.feed(toks[t])
            self.seen[f.slot] = len(f.seq)
            frame = r.top if r.error is None else active_frame(toks[t] for t in f.seq)
            out.append(self.frame_fn(tuple(map(ids.__getitem__, frame))))
        return out


def oracle_predictor(view: str, vocab: Vocab, library=None) -> Predictor:
    """The oracle for a view: g* on the active frame (RM), or g* o Pi_rec on the trace (CoT)."""
    check_view(view)
    oracle = Oracle(vocab, library)
    return oracle if view == "rm" else OnActiveFrame(oracle.next_id, vocab)


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
    """When a row stops as invalid. Apply to the produced trace whatever the view, so that the
    two learners' outputs end for the same reasons."""

    max_depth: int = 64
    """Frames on the stack (the root is depth 1); the pool's deepest expression has 23."""
    max_frame_tokens: int | None = None
    """Tokens of the active frame, visible plus generated (None: no limit beyond what the
    predictor can read, its block size)."""
    max_new_tokens: int = 32768
    """Generated trace tokens (the pool's longest trace has about 5,000)."""


@dataclass
class Generation:
    """One expression's decoding outcome."""

    expr: str
    tokens: list[str]  # the flattened trace produced, written expression first
    prompt_len: int
    answer: str | None  # the root's returned payload, space-joined, if the root returned
    valid: bool
    reason: str | None  # why the row stopped as invalid
    max_depth: int
    n_frames: int  # active-frame examples cut (= frames of the paper's table on a full trace)
    fed: int  # tokens the predictor was fed (prefills included): the decoding cost

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.prompt_len


class _Row:
    __slots__ = ("i", "slot", "text", "replay", "prompt", "out", "seq", "keep", "event", "parents", "fed")

    def __init__(self, i: int, slot: int, expr: Call, vocab: Vocab):
        prompt = expr_tokens(expr)
        self.i, self.slot, self.text = i, slot, to_text(expr)
        self.replay = StackReplay(prompt)
        self.prompt = prompt
        self.out: list[int] = []  # generated ids
        self.seq = vocab.encode(prompt)  # the observation (both views start from the written call)
        self.keep = 0
        self.event: str | None = NEW
        self.parents: list[list[int]] = []  # RM: the suspended frames below the top, as ids
        self.fed = 0


def check_view(view: str) -> None:
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")


def generate(predictor: Predictor, exprs: Sequence[str | Call], vocab: Vocab, view: str,
             limits: Limits = Limits(), batch_size: int = 64,
             progress: Callable[[int], None] | None = None, longest_first: bool = True) -> list[Generation]:
    """Greedy-decode every expression in `view`, `batch_size` rows at a time; results in input order.

    `exprs` are written expressions (text or parsed); `progress(k)` is called as k rows finish.
    With `longest_first` the expressions with the longest canonical traces enter the slots
    first: rows are independent, so this changes no result, only shortens the run's tail (a
    long trace started last would decode alone at the end).
    """
    check_view(view)
    calls = [e if isinstance(e, Call) else parse(e) for e in exprs]
    order = list(range(len(calls)))
    if longest_first:
        order.sort(key=lambda i: -trace_stats(calls[i]).trace_len)
    rm = view == "rm"
    block = predictor.block_size
    max_frame = limits.max_frame_tokens
    toks = vocab.tokens
    n_vocab = len(toks)
    results: list[Generation | None] = [None] * len(exprs)
    todo = iter(order)
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
        if len(row.out) > limits.max_new_tokens:
            return f"more than {limits.max_new_tokens} generated tokens"
        row.keep = len(row.seq)
        row.event = None
        if not rm:
            row.seq.append(t)
        elif event is None:
            row.seq.append(t)
        elif event == "push":
            if r.depth > limits.max_depth:
                return f"deeper than {limits.max_depth} frames"
            start = len(r.stack[-2].tokens)  # the parent keeps its tokens before <call>
            q = row.seq[start + 1:]
            del row.seq[start:]
            row.parents.append(row.seq)
            row.seq, row.keep, row.event = q, 0, PUSH
        else:  # pop: the child's seq ends with <return> a; the parent gets a
            parent = row.parents.pop()
            a = row.seq[len(row.seq) - (len(r.top) - len(parent)):]
            row.keep = len(parent)
            parent.extend(a)
            row.seq, row.event = parent, POP
        if max_frame is not None and len(r.top) > max_frame:
            return f"active frame longer than {max_frame} tokens"
        return None

    while True:
        for s in range(n_slots):
            if slots[s] is None:
                i = next(todo, None)
                if i is None:
                    break
                slots[s] = _Row(i, s, calls[i], vocab)
        live = [row for row in slots if row is not None]
        if not live:
            break
        done = 0
        feeds = []
        for row in live:
            if block is not None and len(row.seq) > block:
                what = "active frame" if rm else "trace"
                finish(row, f"{what} of {len(row.seq)} tokens exceeds the model's block size {block}")
                done += 1
                continue
            feeds.append(Feed(row.slot, row.seq, row.keep, row.event))
            row.fed += len(row.seq) - row.keep
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

"""Lane packing: every active-frame example of a trace in one sequence, exactly.

A frame's committed tokens only ever grow; what the active-frame map removes are the
pending `<call> ... </call>` blocks. So the examples of one trace form a forest: per frame
instance, a *trunk* of committed tokens (its call payload, then what it writes and the
values its children return), with each pending call block *branching* off the trunk at
the point where it was opened. This is the construction of the paper's CoT-simulates-RM
proof: every ordinary token has an owner frame, every token of an unfinished block is
pending, attention is restricted to the tokens the active frame would contain, and
positions are re-indexed to where each token sits in that frame.

`lane_pack(tokens, prompt_len)` returns the lane sequence of one trace:
- token i may attend to token j iff both belong to the same frame instance, j comes no
  later than i, and j is on the trunk or on i's own branch;
- `pos[i]` is the token's position inside its frame (trunk tokens after a closed branch
  reuse the positions the branch had: the returned value sits where `<call>` stood);
- `labels[i]` is the next target token that the state at i predicts, or None.

Targets are exactly the per-frame examples' targets (a test checks the per-target logits
against running every example separately). The rule above is `rlmlab.attention.layout.visible`
(a lane sequence's layout: `Layout.of_lanes`); the tensors are in `rlmlab.attention.backends`,
and `simulate_rm` (RM's prediction for every prefix of a flattened sequence from one pass over
its lanes) in `rlmlab.measuring.simulate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlmlab.errors import TraceError
from rlmlab.task.events import ERROR, POP, TraceReader
from rlmlab.task.vocab import CALL

IGNORE = -100  # the target id of a position without a target: F.cross_entropy's ignore_index default


@dataclass
class Lanes:
    """One trace (or several, concatenated) in lane form; all lists have one entry per lane token."""

    tokens: list[str]
    pos: list[int]
    frame: list[int]  # frame instance id (unique within the packed sequence)
    branch: list[int]  # -1 on the trunk, else the id of the pending call block
    labels: list[str | None]  # next-token target predicted at this position, or None
    example_targets: list[list[int]]  # per active-frame example (in cut order): lane index of each target
    owner: list[int]  # per token of the flattened input: lane index whose state is the active frame after it
    flat: list[int]  # per lane token, its place in the flattened input (a payload where its caller
    # wrote it, a returned value where the child wrote it): the "trace" position index

    def __len__(self) -> int:
        return len(self.tokens)


class _FrameLane:
    __slots__ = ("trunk_len", "branch", "branch_len", "segment", "trunk_at", "branch_at")

    def __init__(self):
        self.trunk_len = 0  # committed tokens: the next trunk token's position
        self.branch = -1  # id of the open call block, if any
        self.branch_len = 0
        self.segment: list[int] = []  # lane indices of the targets of the current segment
        self.trunk_at: list[int] = []  # place in the input of each trunk token
        self.branch_at: list[int] = []  # ... and of each token of the open call block


def lane_pack(tokens: Sequence[str], prompt_len: int, frame_offset: int = 0) -> Lanes:
    """Lane form of a flattened trace (or of any legal prefix of one). The pushes, pops, call
    payloads and returned values are the replay's (`TraceReader`); an illegal sequence raises
    TraceError."""
    out = Lanes([], [], [], [], [], [], [], [])
    lane_of_frame: list[_FrameLane] = []
    per_frame_tokens: list[list[tuple]] = []  # frame -> [(tok, pos, branch, place in the input)]
    n_branches = 0

    def new_frame() -> int:
        lane_of_frame.append(_FrameLane())
        per_frame_tokens.append([])
        return len(lane_of_frame) - 1

    # Lane indices are assigned after all frames are known (frames are laid out one after
    # another), so record (frame, slot) first and resolve at the end.
    def add(f: int, tok: str, pos: int, branch: int, target: bool, at: int) -> tuple[int, int]:
        toks = per_frame_tokens[f]
        slot = (f, len(toks))
        toks.append((tok, pos, branch, at))
        fl = lane_of_frame[f]
        (fl.trunk_at if branch == -1 else fl.branch_at).append(at)
        if target:
            lane_of_frame[f].segment.append(slot)
        return slot

    stack = [new_frame()]
    owner_slots: list[tuple[int, int]] = []
    examples: list[list[tuple[int, int]]] = []
    root = lane_of_frame[stack[0]]
    for i, t in enumerate(tokens[:prompt_len]):
        owner_slots.append(add(stack[0], t, root.trunk_len, -1, False, i))
        root.trunk_len += 1
    reader = TraceReader(tokens[:prompt_len])

    def commit(f: int, toks: list[str], places: list[int]) -> tuple[int, int]:
        """Append input tokens (a child's call payload, or a returned value) to frame f's trunk;
        returns the last one's slot, whose state is the new active frame. `places`: where each
        was written in the input (a value a grandchild returned keeps the grandchild's place)."""
        fl = lane_of_frame[f]
        for tok, at in zip(toks, places):
            slot = add(f, tok, fl.trunk_len, -1, False, at)
            fl.trunk_len += 1
        return slot

    def cut(fl: _FrameLane) -> None:
        examples.append(fl.segment)
        fl.segment = []

    feed = reader.feed
    f = stack[-1]
    fl = lane_of_frame[f]
    for i in range(prompt_len, len(tokens)):
        t = tokens[i]
        ev = feed(t)
        if ev is not None and ev == ERROR:
            raise TraceError(reader.error, i)
        if fl.branch != -1:  # inside a pending call block
            slot = add(f, t, fl.trunk_len + fl.branch_len, fl.branch, True, i)
            fl.branch_len += 1
            if ev is None:  # the block goes on (an illegal token raised above)
                owner_slots.append(slot)
                continue
            cut(fl)
            payload_at = fl.branch_at[1:-1]  # the block is `<call> q </call>`
            fl.branch, fl.branch_at = -1, []
            f = new_frame()
            stack.append(f)
            fl = lane_of_frame[f]
            owner_slots.append(commit(f, reader.top, payload_at))
            continue
        if t == CALL:
            fl.branch = n_branches
            n_branches += 1
            fl.branch_len = 1
            owner_slots.append(add(f, t, fl.trunk_len, fl.branch, True, i))
            continue
        slot = add(f, t, fl.trunk_len, -1, True, i)
        fl.trunk_len += 1
        if ev is not None and ev == POP:
            cut(fl)
            value_at = fl.trunk_at[len(fl.trunk_at) - len(reader.value) - 1:-1]  # `<return> v </return>`
            stack.pop()
            f = stack[-1]
            fl = lane_of_frame[f]
            owner_slots.append(commit(f, reader.value, value_at))
            continue
        owner_slots.append(slot)
    for f in reversed(stack):  # segments still open (the root's last one, or a prefix's)
        if lane_of_frame[f].segment:
            cut(lane_of_frame[f])

    # Lay the frames out one after another and translate slots to lane indices.
    base, start = [], 0
    for f, toks in enumerate(per_frame_tokens):
        base.append(start)
        start += len(toks)
        if toks:
            tok, pos, b, at = zip(*toks)
            out.tokens.extend(tok)
            out.pos.extend(pos)
            out.branch.extend(b)
            out.flat.extend(at)
        out.frame.extend([frame_offset + f] * len(toks))
    out.labels = [None] * start
    for targets in examples:
        for f, s in targets:
            # A target is predicted from the state just before it in its frame's lane order.
            out.labels[base[f] + s - 1] = per_frame_tokens[f][s][0]
    out.example_targets = [[base[f] + s for f, s in ex] for ex in examples]
    out.owner = [base[f] + s for f, s in owner_slots]
    return out

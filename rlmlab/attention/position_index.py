"""Which position index each token gets (`model.position_index`): counted from the start of
the flattened trace, or from the start of the active frame the token belongs to.

RM differs from CoT in two ways at once: it sees one frame instead of the whole trace, and it
counts positions from each frame's start instead of the trace's. This option separates the
two (docs/positions.md, "Where positions count from"): what a learner *sees* stays its observation;
only the index its tokens are placed at changes. The encoding that turns an index into
something the model reads (learned table, RoPE, ...) is `model.positions`, unchanged.

- "frame": a token's index is the place it has in RM's active frame when it is written. The
  written expression is the root frame's context (0..prompt_len-1); a call block `<call> q
  </call>` is written by the caller at the caller's places; a child's first token follows its
  payload q (which RM's child frame starts with); after a child returns, the caller goes on
  where RM's caller does: at its `<call>`'s place plus the returned value's length. On a
  legal trace this is `len(TraceReader.top)` just before the token is fed. CoT's targets then
  sit at exactly the index RM predicts them at.
- "trace": a token's index is its place in the flattened trace. An RM frame's tokens keep the
  places they were written at: the prompt at 0.., a child's payload where the caller wrote it
  inside its call block, a returned value where the child wrote it inside `<return> v
  </return>`. So RM reads one frame but indexes it as CoT would; the indices of a frame
  increase, with gaps where other frames' tokens stood.

None (the default) is each learner's own: CoT "trace", RM "frame", every committed run. Only
the CoT and RM families take the other index; the window and reduction observations re-index
their contexts in ways of their own and refuse it.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlmlab.errors import ConfigError
from rlmlab.task.events import POP, PUSH, TraceReader

POSITION_INDEXES = ("trace", "frame")
"""The values of `model.position_index` besides None (each learner's own)."""
OWN_INDEX = {"cot": "trace", "rm": "frame"}
"""The index each observation family counts by itself (`Observation.name` of CoT and RM)."""


def check_index(value, key: str = "model.position_index") -> str | None:
    if value is not None and value not in POSITION_INDEXES:
        raise ConfigError(f"{key} must be one of {', '.join(POSITION_INDEXES)} or null (the learner's own), "
                          f"got {value!r}")
    return value


def other_index(observation_name: str, index: str | None) -> str | None:
    """The index to apply on top of the observation's own: None when `index` is None or is its
    own, else `index`. An observation that has no other index refuses in one line."""
    if index is None or OWN_INDEX.get(observation_name) == index:
        return None
    if observation_name not in OWN_INDEX:
        raise ConfigError(f"model.position_index={index} applies to the cot and rm learners only, "
                          f"not {observation_name!r} (it re-indexes its context itself)")
    return index


def frame_positions(tokens: Sequence[str], prompt_len: int) -> list[int]:
    """The "frame" index of every token of a flattened trace (or of a prefix of one); total on
    any sequence, since it replays outside the legal mode."""
    r = TraceReader(tokens[:prompt_len], legal=False)
    out = list(range(prompt_len))
    feed = r.feed
    for t in tokens[prompt_len:]:
        out.append(len(r.top))
        feed(t)
    return out


class _Indexed:
    """A tracker wrapped to carry positions of another index (`pos`, one per token of `seq`);
    the observation, the cache prefix and the events stay the inner tracker's."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def seq(self):
        return self.inner.seq

    @property
    def keep(self):
        return self.inner.keep

    @property
    def event(self):
        return self.inner.event


class FrameIndexed(_Indexed):
    """A whole-trace tracker (CoT) whose tokens carry the "frame" index."""

    def __init__(self, inner, prompt_len: int):
        super().__init__(inner)
        self.pos = list(range(prompt_len))
        self._next = prompt_len

    def advance(self, t, event, replay) -> None:
        self.inner.advance(t, event, replay)
        self.pos.append(self._next)
        self._next = len(replay.top)  # the replay has taken t: where the next token goes


class TracePlaces:
    """The "trace" index of an active frame, kept through a replay: `pos` holds, for each token
    of the active frame, the place it was written at in the flattened trace. The places move
    with their tokens when the stack parks a caller, hands a child its payload and gives the
    caller its value, exactly as the active-frame tracker moves the tokens. `advance(event,
    replay)` takes the next trace token after `replay` has fed it (`event` its feed's result)."""

    def __init__(self, prompt_len: int):
        self.pos = list(range(prompt_len))
        self._parents: list[list[int]] = []
        self.n = prompt_len  # trace tokens so far: the place of the next one

    def advance(self, event, replay) -> None:
        at, self.n = self.n, self.n + 1
        if event is None:
            self.pos.append(at)
        elif event == PUSH:
            start = len(replay.stack[-2].tokens)  # where the caller's <call> stood (it keeps what came before)
            payload = self.pos[start + 1:]
            del self.pos[start:]
            self._parents.append(self.pos)
            self.pos = payload
        elif event == POP:  # the value is the last places of the child, `<return> v` before `</return>`
            value = self.pos[len(self.pos) - len(replay.value):]
            self.pos = self._parents.pop()
            self.pos.extend(value)


class TraceIndexed(_Indexed):
    """An active-frame tracker (RM) whose tokens carry the "trace" index."""

    def __init__(self, inner, prompt_len: int):
        super().__init__(inner)
        self.places = TracePlaces(prompt_len)

    @property
    def pos(self):
        return self.places.pos

    def advance(self, t, event, replay) -> None:
        self.places.advance(event, replay)
        self.inner.advance(t, event, replay)


def trace_places_of_frames(tokens: Sequence[str], prompt_len: int) -> list[list[int]]:
    """The "trace" index of every token of each active-frame example of a trace, in cut order
    (`rlmlab.task.frames.cut_examples`: one per push, per pop, and the last): an example is
    its frame up to and including the closer that cuts it, which stands at its own place."""
    r = TraceReader(tokens[:prompt_len])
    places = TracePlaces(prompt_len)
    out = []
    for i in range(prompt_len, len(tokens)):
        event = r.feed(tokens[i])
        if event is not None and event != PUSH and event != POP:
            out.append(places.pos + [i])  # the root's `</return>` (or an illegal token: the caller raises)
            return out
        if event is not None:
            out.append(places.pos + [i])
        places.advance(event, r)
    if len(places.pos) > r.stack[-1].seg_start:  # a prefix that stops inside a segment
        out.append(list(places.pos))
    return out


def example_positions(observation_name: str, index: str | None, tokens: Sequence[str],
                      prompt_len: int) -> list[list[int]] | None:
    """Per example of the observation (`Observation.examples`, in order), the position of each of
    its tokens at `index`; None when the index is the observation's own (positions 0..n-1)."""
    index = other_index(observation_name, index)
    if index is None:
        return None
    if index == "frame":
        return [frame_positions(tokens, prompt_len)]
    return trace_places_of_frames(tokens, prompt_len)


def indexed_tracker(tracker, observation_name: str, index: str | None, prompt_len: int):
    """`tracker` as it is (its positions are its columns), or wrapped to carry `index`."""
    index = other_index(observation_name, index)
    if index is None:
        return tracker
    return FrameIndexed(tracker, prompt_len) if index == "frame" else TraceIndexed(tracker, prompt_len)

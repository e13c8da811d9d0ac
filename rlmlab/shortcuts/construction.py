"""What a shortcut construction is, and the sampler that draws its examples.

A construction pairs a training distribution, on which a planted signal S(x) equals the answer,
with an OOD distribution that keeps the same recursive sub-expressions and breaks that
equality. It writes a template around sampled recursive parts (`Candidate`), reads S from the
executed flattened trace (what CoT reads), names the strata it balances on, and completes a
candidate into a training or an OOD expression. Most constructions couple S to the answer with
a compensating literal argument of the root, chosen in training so that the answer is S and OOD
so that it is not. That literal never equals S: z = 0 is left out of Case 1 and of the
aggregates (Y = S - 0 would be S; z = 0 is otherwise the most common value, 27% of Z, because
factorial(n >= 5, .) is 0 mod 10), and hidden_literal keeps v != 0 and Y != k.

Recursive sub-expressions. "Z" is a call of a tail-recursive function (a function of kind
"recursive": accum_sum, factorial, fibonacci) whose arguments come from the paper's generator
(Z is nesting level 1), that makes at least `min_recursions` recursive calls and has at least
`min_returns` internal integer returns (`trace.internal_returns`). `ShortcutSampler` draws
the candidates and balances the construction's strata.

Every template is written with the paper's library functions only, so the paper's task
(`PAPER_TASK`, its vocabulary) serves every construction; they run on no other task.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rlmlab.errors import ConfigError, DataError
from rlmlab.shortcuts.root_frame import TraceFrame, child, descendants, frame_tree, internal_returns
from rlmlab.task.expr import INT, Call
from rlmlab.task.library import Library
from rlmlab.task.sampler import ExpressionSampler, GeneratorConfig
from rlmlab.task.taskfile import paper_task
from rlmlab.task.trace import Execution, execute, trace_stats

Side = Literal["train", "ood"]


# --- constructions -------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """Sampled recursive parts of one example, with what their trace says about them."""

    parts: tuple[Call, ...]
    """The sampled sub-expressions, in the construction's order (Z; or H, V; or Z1)."""
    key: object
    """Stratum the construction balances on (z, S, k or (z parity, S))."""
    facts: Mapping[str, object]
    """Values read from the trace with a placeholder compensating argument (z, S, v, k...)."""


class Construction(ABC):
    """One train/OOD pair. Subclasses define the template, S, the strata and the completion."""

    name: str = ""
    title: str = ""
    """Row label of the paper's table."""
    excluded: bool = False
    """True for the ablations the validity checks must reject."""
    compensating_slot: int | None = 1
    """Root argument that compensates for S in training (left out of the carrier of check b)."""

    @abstractmethod
    def signal(self, tokens: Sequence[str], prompt_len: int) -> str:
        """S(x), from the complete flattened trace."""

    @abstractmethod
    def draw_candidate(self, rng: random.Random, s: "ShortcutSampler") -> Candidate | None:
        """One candidate from the shared (train = OOD) distribution of recursive parts, or None."""

    def target(self, rng: random.Random):
        """A stratum drawn uniformly: the key the next example must have."""
        return rng.randrange(10)

    @abstractmethod
    def complete(self, cand: Candidate, split: Side, rng: random.Random, s: "ShortcutSampler") -> Call | None:
        """The full expression for `split` (None: this candidate cannot serve; draw again)."""


def digits_except(*excluded: int) -> list[int]:
    """The digits 0-9 other than `excluded`, in order (OOD draws its compensating literal here)."""
    return [d for d in range(10) if d not in excluded]


def digit_literal(d: int) -> str:
    """The literal token of digit `d`."""
    return str(d)


# --- drawing examples ----------------------------------------------------------------

def tail_recursive(library: Library) -> tuple[str, ...]:
    """The library's tail-recursive functions, from each function's kind."""
    return tuple(f.name for f in library if f.kind == "recursive")


PAPER_TASK = paper_task()
"""The task of every construction: their templates are written in the paper's functions."""
TAIL_RECURSIVE = tail_recursive(PAPER_TASK.library)


@dataclass(frozen=True)
class ShortcutConfig:
    """How the recursive sub-expressions of the constructions are drawn."""

    max_trace_len: int = 2048
    """Longest complete trace kept (written expression included); the same for train and OOD."""
    min_returns: int = 3
    """Least number of internal integer returns of Z (the aggregates read three)."""
    min_recursions: int = 1
    """Least number of recursive self-calls of Z: Z must actually recurse."""
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    """Generator for the arguments of Z and for W, V of the hidden-literal helper."""
    max_draws: int = 50_000
    """Candidate draws allowed for one example before the sampler gives up with DataError."""

    def __post_init__(self):
        for name in ("max_trace_len", "min_returns", "max_draws"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if isinstance(self.min_recursions, bool) or not isinstance(self.min_recursions, int) \
                or self.min_recursions < 0:
            raise ConfigError(f"min_recursions must be an integer >= 0, got {self.min_recursions!r}")


class ShortcutSampler:
    """Draws examples of one construction and split from one explicit RNG.

    Candidates are drawn from the construction's distribution and filed by stratum; an example
    first draws a stratum uniformly, then takes the oldest filed candidate of that stratum,
    drawing more until one exists. This is rejection sampling onto a uniform stratum
    distribution that wastes no draw. Same rng state, same examples.
    """

    BUCKET_CAP = 2_000

    def __init__(self, construction: Construction, rng: random.Random,
                 config: ShortcutConfig = ShortcutConfig()):
        self.construction, self.rng, self.config = construction, rng, config
        self.library = PAPER_TASK.library
        self._buckets: dict[object, deque] = defaultdict(deque)
        self._z_by_value: dict[int, deque] = defaultdict(deque)
        # Z: a tail-recursive root with generator arguments.
        self._z_sampler = ExpressionSampler(self.library, config.generator, roots=list(tail_recursive(self.library)))
        self._int_sampler = ExpressionSampler(self.library, config.generator,
                                              roots=[f.name for f in self.library if f.return_type == INT])

    def draw(self, split: Side) -> Call:
        if split not in ("train", "ood"):
            raise ConfigError(f"split must be 'train' or 'ood', got {split!r}")
        c = self.construction
        for _ in range(self.config.max_draws):
            cand = self._candidate(c.target(self.rng))
            expr = c.complete(cand, split, self.rng, self)
            # the completed expression can be longer than the placeholder one (sibling_copy)
            if expr is not None and trace_stats(expr, self.library).trace_len <= self.config.max_trace_len:
                return expr
        raise DataError(f"{c.name}: no {split} example after {self.config.max_draws} candidates")

    def _candidate(self, key) -> Candidate:
        bucket = self._buckets[key]
        if bucket:
            return bucket.popleft()
        c = self.construction
        for _ in range(self.config.max_draws):
            cand = c.draw_candidate(self.rng, self)
            if cand is None:
                continue
            if cand.key == key:
                return cand
            if len(self._buckets[cand.key]) < self.BUCKET_CAP:
                self._buckets[cand.key].append(cand)
        raise DataError(f"{c.name}: stratum {key!r} not reached in {self.config.max_draws} draws "
                        f"(max_trace_len={self.config.max_trace_len} may be too small)")

    # -- shared pieces --

    def run(self, expr: Call) -> Execution | None:
        """Execute a (placeholder) expression; None if its trace is longer than allowed."""
        if trace_stats(expr, self.library).trace_len > self.config.max_trace_len:
            return None
        return execute(expr, self.library)

    def z_ok(self, tokens: Sequence[str], frame: TraceFrame) -> bool:
        """Z requirements: enough internal integer returns and enough recursive self-calls."""
        fn = frame.call[0]
        recursions = sum(1 for f in descendants(frame) if f.call[0] == fn)
        return (recursions >= self.config.min_recursions
                and len(internal_returns(tokens, frame)) >= self.config.min_returns)

    def draw_z(self) -> Call:
        return self._z_sampler.sample(self.rng)

    def draw_int_call(self) -> Call:
        return self._int_sampler.sample(self.rng)

    def z_with_value(self, value: int, wrap) -> Call:
        """A valid Z (checked inside `wrap(Z)`, Z the first child) with value `value`; draws
        are filed by value so none is wasted."""
        bucket = self._z_by_value[value]
        if bucket:
            return bucket.popleft()
        for _ in range(self.config.max_draws):
            z = self.draw_z()
            ex = self.run(wrap(z))
            if ex is None:
                continue
            tree = frame_tree(ex.tokens, ex.prompt_len)
            zf = child(tree, 0)
            if not self.z_ok(ex.tokens, zf):
                continue
            v = int(zf.value)
            if v == value:
                return z
            if len(self._z_by_value[v]) < self.BUCKET_CAP:
                self._z_by_value[v].append(z)
        raise DataError(f"{self.construction.name}: no Z with value {value} in {self.config.max_draws} draws")

"""The six shortcut constructions of the paper's shortcut table, and the checks that keep them valid.

Each construction pairs a training distribution, on which a planted signal S(x) equals the
answer, with an OOD distribution that keeps the same recursive sub-expressions and breaks
that equality. S is read from the executed flattened trace (what CoT reads). Positions are
0-based indices into the complete token sequence `Execution.tokens`: the written expression
first, then every emitted token.

Shared vocabulary: every template is written with the paper's library functions only, so the
paper's task (`paper_task()`, its vocabulary) serves every construction; they run on no other task.

Recursive sub-expressions. "Z" is a call of a tail-recursive function (a function of kind
"recursive": accum_sum, factorial, fibonacci) whose arguments come from the paper's generator (Z is nesting level 1), that makes
at least `min_recursions` recursive calls and has at least `min_returns` internal integer
returns. The internal returns of a frame are the values v of the `<return> v </return>`
blocks (v a digit) inside that frame's span of the trace, in trace order; the last one is the
frame's own value (the base case of a tail recursion returns a literal).

Constructions (training | OOD):

- copy_deep_return (Case 1): add(square(square(Z)), Y), S = z. Train Y = (z - z^4) mod 10 so
  the answer is z | Y uniform over the other nine digits. z is stratified uniform over 1..9.
- hidden_literal: add(max(multiply(H, 0), V), Y) with the helper H = T(N, W, ...), T
  tail-recursive (a Z whose second argument is replaced by a sampled int call W): the helper
  binds k = eval(W) (acc, or a for fibonacci) and tail-calls its body with k as an argument
  (W takes the accumulator, not the counter, so the recursion length does not grow with k);
  multiply(., 0) discards H's value and max(0, v) passes on V's value v, so the root sees
  x := v, never k or H's value. S = k. Train Y = (k - v) mod 10 | Y uniform over the digits
  other than that and k. Sampled so that k is not a literal of W, v is not 0 and not k, hence
  neither the root's literal Y nor the root payload (v, Y) ever shows k (a constant
  selector, e.g. multiply(H,0) alone, would force Y = k: S as a root literal).
- long_range_aggregate: add(Z, Y), S = (r1 + r2 + r3) mod 10 over the first three internal
  returns of Z. Train Y = (S - z) mod 10 | Y uniform over the other nine digits. S is
  stratified uniform (z keeps its natural distribution over 1..9), so the same z occurs with
  many S (measured by validity check b).
- near_answer_aggregate: as above with the last three internal returns of Z.
- position_weighted_aggregate: as above with S = (sum of positions t of the internal returns
  r_t = 0) mod 10; Z must have at least one zero return.
- position_parity (Case 2): is_even(add(Z, Y)), S = "True" if the final answer token's position
  (len(tokens) - 2) is even else "False". The position does not depend on the digit Y, so for
  each Z, train draws Y uniformly among the five digits that make the answer equal S, OOD
  among the five that make it differ. Z is stratified uniformly over the four cells
  (z parity, S), which keeps the marginals of Z and of Y identical (Y uniform) in both.

The compensating literal never equals S: z = 0 is left out of Case 1 and of the aggregates
(Y = S - 0 would be S; z = 0 is otherwise the most common value, 27% of Z, because
factorial(n >= 5, .) is 0 mod 10), and hidden_literal keeps v != 0 and Y != k.

Excluded ablations (built only to show the checks reject them):

- sibling_copy: max(Z1, Z2) with S the long-range aggregate of Z1; train keeps z1 <= S and
  draws a sibling Z2 with value S, so the answer is always the second child's value | Z2 is
  redrawn with a value that makes max(z1, z2) != S. Copying the second child fits training
  and fails OOD: the root frame underdetermines which child to return (check a).
- one_to_one_wrapper: Case 1 with the injective wrapper multiply(Z, 3): the root payload
  3z mod 10 is an invertible code for z = S (check b).

Validity checks (run whenever a data set is built; a failure raises DataError). The root frame
of an example is what RM's last root frame holds: the root function, its payload (the bound
value of every parameter, literal or returned, in order) and the local position of its answer.

a. identifiable: (i) over training, the same (function, payload) never has two answers;
   (ii) no sibling-copy or constant rule explains the training answers (agrees on at least
   `copy_fit` of them) while failing OOD (agrees on fewer than `copy_fit`).
b. not one-to-one: the carrier of an example is its payload without the compensating
   argument, plus the parity of the answer's local position. In the training set or in the
   OOD set, a share of at least `min_ambiguity` of the examples must have a carrier
   that is also the carrier of an example (training or OOD) with a different S. If S were a
   function of this carrier, RM could follow S from its own frame. (Training refutes that in the
   compensating constructions; in the parity case only OOD can, since S = answer =
   is_even(payload) on all of training.)
c. no static literal: for every literal leaf position of the written expression (a path of
   argument indices), the fraction of training examples whose literal there equals S is
   below `max_literal_match`. Chance is about 1/10 for a balanced digit S; a slot that equals
   S on most examples writes S into the static expression.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import pyarrow as pa

from rlmlab.errors import ConfigError, DataError
from rlmlab.task.expr import (
    DIGITS,
    INT,
    Call,
    Expr,
    infer_type,
    parse,
    to_text,
)
from rlmlab.task.frames import FrameExample, StackReplay
from rlmlab.task.sampler import ExpressionSampler, GeneratorConfig
from rlmlab.task.trace import Execution, execute, trace_stats
from rlmlab.task.taskfile import paper_task
from rlmlab.task.vocab import ASSIGN, CALL, END_CALL, END_RETURN, RETURN

Side = Literal["train", "ood"]


def tail_recursive(library=None) -> tuple[str, ...]:
    """The library's tail-recursive functions, from each function's kind."""
    return tuple(f.name for f in (library or paper_task().library) if f.kind == "recursive")


TAIL_RECURSIVE = tail_recursive()
FORMAT = "rlmlab.shortcut/1"
N_IID = 300  # paper: n = 300 IID and 300 OOD evaluation expressions per construction
N_OOD = 300
N_VAL = 300


# --- reading a trace ------------------------------------------------------------

@dataclass(frozen=True)
class TraceFrame:
    """One frame of an executed trace, located in the flattened token sequence."""

    call: tuple[str, ...]
    """The written call the frame evaluates (the root: the whole expression)."""
    start: int
    """Index of the first token the frame emits (just after the `</call>` that opened it)."""
    end: int
    """Index one past the frame's closing `</return>`."""
    value: str
    """The value the frame returns."""
    children: tuple["TraceFrame", ...]
    """Frames it opened, in order: argument calls, then the body or branch call."""


def frame_tree(tokens: Sequence[str], prompt_len: int) -> TraceFrame:
    """The frames of a complete trace as a tree, read off the stack replay that cuts RM's
    examples (`StackReplay`): a frame opens at its push and closes at its `</return>`, whose
    payload is its value."""
    replay = StackReplay(tokens[:prompt_len])
    stack: list[dict] = [{"call": tuple(tokens[:prompt_len]), "start": prompt_len, "children": []}]
    for i in range(prompt_len, len(tokens)):
        event = replay.feed(tokens[i])
        if event == "error":
            raise DataError(f"not a legal trace at token {i}: {replay.error}")
        if event == "push":
            stack.append({"call": tuple(replay.top), "start": i + 1, "children": []})
        elif event in ("pop", "done"):
            returned = replay.answer if event == "done" else replay.top[-1:]
            b = stack.pop()
            frame = TraceFrame(b["call"], b["start"], i + 1, returned[-1], tuple(b["children"]))
            if event == "done":
                if i != len(tokens) - 1:
                    raise DataError("trace continues after the root returned")
                return frame
            stack[-1]["children"].append(frame)
    raise DataError("incomplete trace: the root frame never returned")


def internal_returns(tokens: Sequence[str], frame: TraceFrame) -> list[tuple[int, int]]:
    """(position, value) of every integer literal return `<return> v </return>` inside `frame`."""
    out = []
    for i in range(frame.start + 1, frame.end - 1):
        if tokens[i - 1] == RETURN and tokens[i + 1] == END_RETURN and tokens[i] in DIGITS:
            out.append((i, int(tokens[i])))
    return out


def child(frame: TraceFrame, *path: int) -> TraceFrame:
    """Follow child indices down the frame tree."""
    for k in path:
        frame = frame.children[k]
    return frame


def answer_position(tokens: Sequence[str]) -> int:
    """Position of the final answer token: the trace ends `<return> a </return>`."""
    return len(tokens) - 2


# --- the RM root frame used by the validity checks -------------------------------

@dataclass(frozen=True)
class RootFrame:
    """What the validity checks need from one example: RM's final root frame and S."""

    fn: str
    """Root function."""
    payload: tuple[str, ...]
    """Bound value of each root parameter in order (literal or value returned by a child)."""
    answer: str
    """The root's answer."""
    answer_pos: int
    """Index of the answer token in RM's final root frame (context + targets)."""
    signal: str
    """S(x)."""
    literals: tuple[tuple[tuple[int, ...], str], ...]
    """(path of argument indices, token) for every literal leaf of the written expression."""


def root_payload(frames: Sequence[FrameExample], prompt_len: int) -> tuple[tuple[str, ...], int]:
    """Bound values of the root frame (its `p := v` pairs after every child returned) and the
    local index of its answer token, from the execution's last root example."""
    last = [f for f in frames if f.depth == 1][-1]
    toks = last.tokens
    payload, i = [], prompt_len
    while i + 2 < len(toks) and toks[i + 1] == ASSIGN:
        payload.append(toks[i + 2])
        i += 3
    return tuple(payload), len(toks) - 2


def literal_paths(e: Expr, path: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], str]]:
    if isinstance(e, str):
        return [(path, e)]
    out = []
    for k, a in enumerate(e.args):
        out.extend(literal_paths(a, path + (k,)))
    return out


def root_frame(ex: Execution, signal: str) -> RootFrame:
    payload, pos = root_payload(ex.frames, ex.prompt_len)
    return RootFrame(ex.expr.fn, payload, ex.value_token, pos, signal, tuple(literal_paths(ex.expr)))


# --- configuration ------------------------------------------------------------------

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


@dataclass(frozen=True)
class ValidityLimits:
    """Thresholds of the validity checks (see the module docstring)."""

    copy_fit: float = 0.95
    """(a) A copy/constant rule "fits" a set when it agrees with at least this share of answers."""
    min_ambiguity: float = 0.5
    """(b) Least share of examples whose carrier co-occurs with two or more S values."""
    max_literal_match: float = 0.5
    """(c) Largest allowed share of training examples whose literal at one position equals S."""

    def __post_init__(self):
        for name in ("copy_fit", "min_ambiguity", "max_literal_match"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {v!r}")


# --- candidates and the sampler driver --------------------------------------------------

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
        self.library = paper_task().library  # the constructions are written in the paper's functions
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
        recursions = sum(1 for i in range(frame.start, frame.end - 1)
                         if tokens[i] == CALL and tokens[i + 1] == fn)
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


def _digits_except(*excluded: int) -> list[int]:
    return [d for d in range(10) if d not in excluded]


def _lit(d: int) -> str:
    return str(d)


# --- Case 1 and its one-to-one ablation -----------------------------------------------

class CopyDeepReturn(Construction):
    """add(W(Z), Y): W = square(square(.)) in Case 1, multiply(., 3) in the one-to-one ablation."""

    name = "copy_deep_return"
    title = "Copy answer from deep return (Case 1)"

    def wrap(self, z: Expr) -> Call:
        return Call("square", (Call("square", (z,)),))

    def wrapped_value(self, z: int) -> int:
        return pow(z, 4, 10)

    z_path = (0, 0, 0)  # root -> square(square(Z)) -> square(Z) -> Z

    def template(self, z: Expr, y: str) -> Call:
        return Call("add", (self.wrap(z), y))

    def signal(self, tokens, prompt_len):
        return child(frame_tree(tokens, prompt_len), *self.z_path).value

    def draw_candidate(self, rng, s):
        z = s.draw_z()
        ex = s.run(self.template(z, "0"))
        if ex is None:
            return None
        zf = child(frame_tree(ex.tokens, ex.prompt_len), *self.z_path)
        if not s.z_ok(ex.tokens, zf) or zf.value == "0":
            return None  # z = 0: Y = 0 - 0 would be S itself, written as the root's literal
        return Candidate((z,), int(zf.value), {"z": int(zf.value)})

    def target(self, rng):
        return rng.randrange(1, 10)

    def complete(self, cand, split, rng, s):
        z = cand.facts["z"]
        y_comp = (z - self.wrapped_value(z)) % 10
        y = y_comp if split == "train" else rng.choice(_digits_except(y_comp))
        return self.template(cand.parts[0], _lit(y))


class OneToOneWrapper(CopyDeepReturn):
    """Ablation: Case 1 with an injective wrapper, so the root payload encodes z invertibly."""

    name = "one_to_one_wrapper"
    title = "Case 1 with a one-to-one wrapper (excluded ablation)"
    excluded = True
    z_path = (0, 0)  # root -> multiply(Z, 3) -> Z

    def wrap(self, z):
        return Call("multiply", (z, "3"))

    def wrapped_value(self, z):
        return (3 * z) % 10  # 3 is a unit mod 10: z -> 3z is a bijection


# --- aggregates of internal returns and the sibling-copy ablation -----------------------

class Aggregate(Construction):
    """add(Z, Y) with S an aggregate of Z's internal integer returns."""

    needs_zero = False
    exclude_zero = True

    @abstractmethod
    def aggregate(self, returns: list[tuple[int, int]]) -> int:
        """S from Z's internal returns [(position, value), ...]."""

    def signal(self, tokens, prompt_len):
        z = child(frame_tree(tokens, prompt_len), 0)
        return str(self.aggregate(internal_returns(tokens, z)))

    def wrap(self, z: Expr, y: Expr = "0") -> Call:
        return Call("add", (z, y))

    def draw_candidate(self, rng, s):
        z = s.draw_z()
        ex = s.run(self.wrap(z))
        if ex is None:
            return None
        zf = child(frame_tree(ex.tokens, ex.prompt_len), 0)
        if not s.z_ok(ex.tokens, zf):
            return None
        rets = internal_returns(ex.tokens, zf)
        if self.needs_zero and not any(v == 0 for _, v in rets):
            return None
        sig, zv = self.aggregate(rets), int(zf.value)
        if zv == 0 and self.exclude_zero:
            return None  # Y = S - z would be S itself: S written as the root's literal
        return Candidate((z,), sig, {"z": zv, "S": sig})

    def complete(self, cand, split, rng, s):
        y_comp = (cand.facts["S"] - cand.facts["z"]) % 10
        y = y_comp if split == "train" else rng.choice(_digits_except(y_comp))
        return self.wrap(cand.parts[0], _lit(y))


class LongRangeAggregate(Aggregate):
    name = "long_range_aggregate"
    title = "Long-range aggregate"

    def aggregate(self, returns):
        return sum(v for _, v in returns[:3]) % 10


class NearAnswerAggregate(Aggregate):
    name = "near_answer_aggregate"
    title = "Near-answer aggregate"

    def aggregate(self, returns):
        return sum(v for _, v in returns[-3:]) % 10


class PositionWeightedAggregate(Aggregate):
    name = "position_weighted_aggregate"
    title = "Position-weighted aggregate"
    needs_zero = True

    def aggregate(self, returns):
        return sum(t for t, v in returns if v == 0) % 10


class SiblingCopy(LongRangeAggregate):
    """Ablation: max(Z1, Z2); training always returns the second child's value (= S)."""

    name = "sibling_copy"
    title = "Sibling copy (excluded ablation)"
    excluded = True

    def wrap(self, z: Expr, y: Expr = "0") -> Call:
        return Call("max", (z, y))

    exclude_zero = False  # z1 <= S must be possible for S = 0

    def complete(self, cand, split, rng, s):
        z1, sig = cand.facts["z"], cand.facts["S"]
        if z1 > sig:
            return None  # max(z1, .) could not equal S
        if split == "train":
            value = sig
        else:
            value = rng.choice([v for v in range(10) if max(z1, v) != sig] or [None])
            if value is None:
                return None
        return self.wrap(cand.parts[0], s.z_with_value(value, lambda z: Call("max", (z, "0"))))


# --- hidden intermediate literal ---------------------------------------------------------

class HiddenLiteral(Construction):
    """add(max(multiply(H, 0), V), Y), H = T(N, W, ...): S = k = eval(W), bound by the helper."""

    name = "hidden_literal"
    title = "Hidden intermediate literal"
    h_path = (0, 0, 0)  # root -> max -> multiply -> H

    @staticmethod
    def template(h: Call, v: Call, y: str) -> Call:
        return Call("add", (Call("max", (Call("multiply", (h, "0")), v)), y))

    def signal(self, tokens, prompt_len):
        # the value the helper binds to its second parameter (acc, or a for fibonacci): the W
        # frame is the helper's second child when its counter argument is a call, else its first
        helper = child(frame_tree(tokens, prompt_len), *self.h_path)
        counter = parse(" ".join(helper.call)).args[0]
        return helper.children[0 if isinstance(counter, str) else 1].value

    def draw_candidate(self, rng, s):
        base = s.draw_z()
        w = s.draw_int_call()
        v = s.draw_int_call()
        # W fills the accumulator, not the counter, so the helper's recursion length (and the
        # trace length) does not grow with k
        h = Call(base.fn, (base.args[0], w) + base.args[2:])
        ex = s.run(self.template(h, v, "0"))
        if ex is None:
            return None
        tree = frame_tree(ex.tokens, ex.prompt_len)
        if not s.z_ok(ex.tokens, child(tree, *self.h_path)):
            return None
        k = int(self.signal(ex.tokens, ex.prompt_len))
        v_val = int(child(tree, 0, 1).value)
        if str(k) in {tok for _, tok in literal_paths(w)} or v_val in (0, k):
            return None  # k must be computed, and must not show in Y (v = 0) or in the payload (v = k)
        return Candidate((h, v), k, {"k": k, "v": v_val})

    def complete(self, cand, split, rng, s):
        k, v = cand.facts["k"], cand.facts["v"]
        y_comp = (k - v) % 10
        y = y_comp if split == "train" else rng.choice(_digits_except(y_comp, k))
        return self.template(cand.parts[0], cand.parts[1], _lit(y))


# --- Case 2: trace-position parity -------------------------------------------------------

class PositionParity(Construction):
    """is_even(add(Z, Y)); S = parity of the final answer token's global position."""

    name = "position_parity"
    title = "Trace-position parity (Case 2)"
    compensating_slot = None  # the root's only argument is the add; the filter does the coupling

    @staticmethod
    def template(z: Expr, y: str) -> Call:
        return Call("is_even", (Call("add", (z, y)),))

    def signal(self, tokens, prompt_len):
        return "True" if answer_position(tokens) % 2 == 0 else "False"

    def target(self, rng):
        return (rng.randrange(2), rng.choice(("True", "False")))

    def draw_candidate(self, rng, s):
        z = s.draw_z()
        ex = s.run(self.template(z, "0"))
        if ex is None:
            return None
        zf = child(frame_tree(ex.tokens, ex.prompt_len), 0, 0)
        if not s.z_ok(ex.tokens, zf):
            return None
        zv, sig = int(zf.value), self.signal(ex.tokens, ex.prompt_len)
        return Candidate((z,), (zv % 2, sig), {"z": zv, "S": sig})

    def complete(self, cand, split, rng, s):
        want_even = (cand.facts["S"] == "True") == (split == "train")
        ys = [y for y in range(10) if ((cand.facts["z"] + y) % 2 == 0) == want_even]
        return self.template(cand.parts[0], _lit(rng.choice(ys)))


CONSTRUCTIONS: dict[str, Construction] = {c.name: c for c in (
    CopyDeepReturn(), HiddenLiteral(), LongRangeAggregate(), NearAnswerAggregate(),
    PositionWeightedAggregate(), PositionParity())}
"""The six constructions of the paper's shortcut table, in table order."""
ABLATIONS: dict[str, Construction] = {c.name: c for c in (SiblingCopy(), OneToOneWrapper())}
"""The two excluded variants; the validity checks reject both."""


def get_construction(name: str) -> Construction:
    try:
        return {**CONSTRUCTIONS, **ABLATIONS}[name]
    except KeyError:
        raise ConfigError(f"unknown shortcut construction {name!r}; known: "
                          f"{', '.join([*CONSTRUCTIONS, *ABLATIONS])}") from None


# --- validity checks ---------------------------------------------------------------------

@dataclass(frozen=True)
class CheckResult:
    """One validity check."""

    name: str
    """"identifiable", "not_one_to_one" or "no_static_literal"."""
    passed: bool
    value: float
    """The measured quantity (see `detail`)."""
    limit: float
    """The threshold it was compared with."""
    detail: str
    """One line saying what was measured and, on failure, why it fails."""


@dataclass(frozen=True)
class ValidityReport:
    """All checks of one construction's data."""

    construction: str
    checks: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict:
        return {"construction": self.construction, "passed": self.passed,
                "checks": [asdict(c) for c in self.checks]}

    def raise_if_invalid(self) -> None:
        bad = [c for c in self.checks if not c.passed]
        if bad:
            raise DataError(f"{self.construction}: invalid shortcut construction: "
                            + "; ".join(f"{c.name}: {c.detail}" for c in bad))


def _share(flags: Iterable[bool]) -> float:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else 0.0


def check_identifiable(train: Sequence[RootFrame], ood: Sequence[RootFrame], limits: ValidityLimits) -> CheckResult:
    answers: dict[tuple, set] = defaultdict(set)
    for r in train:
        answers[(r.fn, r.payload)].add(r.answer)
    conflicts = sum(1 for a in answers.values() if len(a) > 1)
    if conflicts:
        return CheckResult("identifiable", False, float(conflicts), 0.0,
                           f"{conflicts} root frame(s) map to two answers over training")
    rules = {}
    width = min((len(r.payload) for r in train), default=0)
    for k in range(width):
        rules[f"copy argument {k}"] = lambda r, k=k: r.payload[k]
    const = Counter(r.answer for r in train).most_common(1)[0][0]
    rules[f"constant {const}"] = lambda r: const
    worst, worst_name = 0.0, ""
    for name, rule in rules.items():
        fit_train = _share(rule(r) == r.answer for r in train)
        fit_ood = _share(rule(r) == r.answer for r in ood)
        if fit_train >= limits.copy_fit and fit_ood < limits.copy_fit:
            return CheckResult("identifiable", False, fit_train, limits.copy_fit,
                               f"rule '{name}' fits {fit_train:.1%} of training but {fit_ood:.1%} of OOD: "
                               "the root frame underdetermines which value to return")
        if fit_train > worst:
            worst, worst_name = fit_train, name
    return CheckResult("identifiable", True, worst, limits.copy_fit,
                       f"root frame determines the answer; best copy/constant rule '{worst_name}' "
                       f"fits {worst:.1%} of training")


def carrier(r: RootFrame, compensating_slot: int | None) -> tuple:
    payload = tuple(v for k, v in enumerate(r.payload) if k != compensating_slot)
    return payload, r.answer_pos % 2


def ambiguity(examples: Sequence[RootFrame], reference: Sequence[RootFrame], compensating_slot: int | None) -> float:
    """Share of `examples` whose carrier is held, among `examples` and `reference`
    together, by examples of two or more different S."""
    sigs: dict[tuple, set] = defaultdict(set)
    for r in list(reference) + list(examples):
        sigs[carrier(r, compensating_slot)].add(r.signal)
    return _share(len(sigs[carrier(r, compensating_slot)]) > 1 for r in examples)


def check_not_one_to_one(train: Sequence[RootFrame], ood: Sequence[RootFrame], compensating_slot: int | None,
                         limits: ValidityLimits) -> CheckResult:
    # Either set can refute "S is a function of RM's root frame": training in the compensating
    # constructions (the same z with different S), OOD in the parity case (where S = answer on
    # all of training); the larger share is the less noisy one when a set is small.
    amb_train, amb_ood = ambiguity(train, ood, compensating_slot), ambiguity(ood, train, compensating_slot)
    value = max(amb_train, amb_ood)
    ok = value >= limits.min_ambiguity
    detail = (f"{amb_train:.1%} of training and {amb_ood:.1%} of OOD examples share their root carrier "
              f"with an example of different S")
    if not ok:
        detail += ": the root payload is a one-to-one code for S"
    return CheckResult("not_one_to_one", ok, value, limits.min_ambiguity, detail)


def check_no_static_literal(train: Sequence[RootFrame], limits: ValidityLimits) -> CheckResult:
    hits: Counter = Counter()
    for r in train:
        for path, tok in r.literals:
            if tok == r.signal:
                hits[path] += 1
    n = max(len(train), 1)
    path, count = hits.most_common(1)[0] if hits else ((), 0)
    rate = count / n
    ok = rate < limits.max_literal_match
    where = "root" + "".join(f".arg{k}" for k in path)
    detail = f"the literal at {where} equals S on {rate:.1%} of training (most of any position)"
    if not ok:
        detail += ": S is written into the static expression"
    return CheckResult("no_static_literal", ok, rate, limits.max_literal_match, detail)


def check_validity(construction: Construction, train: Sequence[RootFrame], ood: Sequence[RootFrame],
                   limits: ValidityLimits = ValidityLimits()) -> ValidityReport:
    """Run checks a, b, c on the root frames of a construction's training and OOD examples."""
    if not train or not ood:
        raise DataError(f"{construction.name}: validity checks need training and OOD examples")
    return ValidityReport(construction.name, (
        check_identifiable(train, ood, limits),
        check_not_one_to_one(train, ood, construction.compensating_slot, limits),
        check_no_static_literal(train, limits),
    ))


# --- data sets ---------------------------------------------------------------------------

SCHEMA = pa.schema([
    ("id", pa.int64()), ("expr", pa.string()), ("root", pa.string()), ("type", pa.string()),
    ("value", pa.string()), ("signal", pa.string()), ("trace_len", pa.int32()), ("max_depth", pa.int16()),
    ("max_frame_width", pa.int32()), ("n_frame_examples", pa.int32()),
])


@dataclass
class ShortcutDataset:
    """One construction's data: training and validation sets, IID and OOD evaluation sets, and its
    validity report. No text is in two of train / val / iid / ood.

    Tables have the pool's columns plus `signal` (S(x) as a token), so the inference code that
    reads pools reads these too."""

    name: str
    """Construction name (a key of CONSTRUCTIONS or ABLATIONS)."""
    params: dict
    """Sizes, seed, sampler configuration, validity limits and the validity report."""
    train: pa.Table
    """Training examples: signal == value on every row."""
    val: pa.Table
    """Validation examples from the training distribution (checkpoint selection / plateau)."""
    iid: pa.Table
    """Held-out examples from the training distribution (no text shared with `train`)."""
    ood: pa.Table
    """OOD examples: signal != value on every row."""

    @property
    def report(self) -> dict:
        return self.params["validity"]

    @staticmethod
    def identity(params: dict) -> dict:
        """What of a data set's `params` the data determine: all of it but the wording of the
        validity checks' details, which follows the code's vocabulary (a saved record is compared
        with a rebuilt set through this)."""
        validity = params.get("validity")
        if not isinstance(validity, dict) or not isinstance(validity.get("checks"), list):
            return params
        checks = [{k: v for k, v in c.items() if k != "detail"} if isinstance(c, dict) else c
                  for c in validity["checks"]]
        return {**params, "validity": {**validity, "checks": checks}}

    def save(self, folder: str | Path) -> Path:
        from rlmlab.experiments.splits import write_table_folder

        return write_table_folder(folder, "shortcut.json", FORMAT, {"name": self.name, "params": self.params},
                                  {"train": self.train, "val": self.val, "iid": self.iid, "ood": self.ood})

    @classmethod
    def load(cls, folder: str | Path) -> "ShortcutDataset":
        from rlmlab.experiments.splits import read_table_folder

        meta, tables = read_table_folder(folder, "shortcut.json", FORMAT)
        for t in ("train", "val", "iid", "ood"):
            if t not in tables:
                raise DataError(f"{folder}: shortcut data set has no {t!r} table")
            if "signal" not in tables[t].column_names:
                raise DataError(f"{folder}: table {t!r} has no 'signal' column")
        if "name" not in meta or "params" not in meta:
            raise DataError(f"{folder}: shortcut.json lacks the name or params")
        return cls(meta["name"], meta["params"], tables["train"], tables["val"], tables["iid"], tables["ood"])


def _row(i: int, ex: Execution, signal: str) -> dict:
    return {"id": i, "expr": to_text(ex.expr), "root": ex.expr.fn, "type": infer_type(ex.expr),
            "value": ex.value_token, "signal": signal, "trace_len": ex.trace_len, "max_depth": ex.max_depth,
            "max_frame_width": ex.max_frame_width, "n_frame_examples": ex.n_frame_examples}


def _draw_set(c: Construction, split: Side, n: int, rng: random.Random, config: ShortcutConfig,
              exclude: set[str]) -> tuple[list[dict], list[RootFrame]]:
    """n distinct examples (texts not in `exclude`), with S checked against the answer."""
    sampler = ShortcutSampler(c, rng, config)
    rows, roots, seen = [], [], set(exclude)
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > n * 20 + 1000:
            raise DataError(f"{c.name}: only {len(rows)} distinct {split} examples found, {n} requested")
        expr = sampler.draw(split)
        text = to_text(expr)
        if text in seen:
            continue
        seen.add(text)
        ex = execute(expr)
        sig = c.signal(ex.tokens, ex.prompt_len)
        if (sig == ex.value_token) != (split == "train"):
            raise DataError(f"{c.name}: {split} example {text} has S={sig} and answer {ex.value_token}")
        rows.append(_row(len(rows), ex, sig))
        roots.append(root_frame(ex, sig))
    return rows, roots


def build_shortcut_dataset(name: str, *, n_train: int = 10_000, n_val: int = N_VAL, n_iid: int = N_IID,
                           n_ood: int = N_OOD, seed: int = 0, config: ShortcutConfig = ShortcutConfig(),
                           limits: ValidityLimits = ValidityLimits(), check: bool = True) -> ShortcutDataset:
    """Sample a construction's training, validation, IID and OOD sets and run the validity checks.

    Each set comes from its own RNG (seeded by name, set and `seed`) and holds distinct texts;
    validation and IID share no text with training or with each other. With `check=True` an invalid construction raises
    DataError naming the failed checks; with `check=False` the report is only recorded.
    """
    c = get_construction(name)
    for label, n in (("n_train", n_train), ("n_val", n_val), ("n_iid", n_iid), ("n_ood", n_ood)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{label} must be a positive integer, got {n!r}")

    def rng(part: str) -> random.Random:
        return random.Random(f"rlmlab-shortcut:{name}:{part}:{seed}")

    train_rows, train_roots = _draw_set(c, "train", n_train, rng("train"), config, set())
    train_texts = {r["expr"] for r in train_rows}
    val_rows, _ = _draw_set(c, "train", n_val, rng("val"), config, train_texts)
    iid_rows, _ = _draw_set(c, "train", n_iid, rng("iid"), config, train_texts | {r["expr"] for r in val_rows})
    ood_rows, ood_roots = _draw_set(c, "ood", n_ood, rng("ood"), config, train_texts)
    report = check_validity(c, train_roots, ood_roots, limits)
    meta = {b"rlmlab.task.vocab": paper_task().vocab.to_json().encode()}
    params = {"construction": c.name, "title": c.title, "excluded": c.excluded, "seed": seed,
              "n_train": n_train, "n_val": n_val, "n_iid": n_iid, "n_ood": n_ood,
              "config": asdict(config), "limits": asdict(limits), "validity": report.to_dict()}
    if check:
        report.raise_if_invalid()
    return ShortcutDataset(c.name, params,
                           *(pa.Table.from_pylist(r, SCHEMA).replace_schema_metadata(meta)
                             for r in (train_rows, val_rows, iid_rows, ood_rows)))


# --- the metric ----------------------------------------------------------------------------

def _pred(r: Mapping, key: str):
    p = r[key]
    return p.strip() if isinstance(p, str) else p


def shortcut_rate(results: Iterable[Mapping], *, prediction_key: str = "prediction",
                  signal_key: str = "signal") -> float:
    """follow_S: the share of (OOD) results whose final answer equals S(x).

    `results` are per-expression mappings with the model's final answer under `prediction_key`
    (a token string; None or "" when no answer was produced, which never follows S) and S
    under `signal_key`. Applies to RM and CoT alike."""
    results = list(results)
    if not results:
        raise DataError("shortcut rate of no results is undefined")
    try:
        return _share(_pred(r, prediction_key) not in (None, "") and _pred(r, prediction_key) == r[signal_key]
                      for r in results)
    except KeyError as e:
        raise DataError(f"result lacks the key {e.args[0]!r}") from None


def shortcut_summary(results: Iterable[Mapping], *, prediction_key: str = "prediction",
                     signal_key: str = "signal", answer_key: str = "value") -> dict:
    """n, accuracy (prediction == answer) and shortcut rate of one evaluation set."""
    results = list(results)
    rate = shortcut_rate(results, prediction_key=prediction_key, signal_key=signal_key)
    try:
        acc = _share(_pred(r, prediction_key) == r[answer_key] for r in results)
    except KeyError as e:
        raise DataError(f"result lacks the key {e.args[0]!r}") from None
    return {"n": len(results), "accuracy": acc, "shortcut_rate": rate}


__all__ = ["CONSTRUCTIONS", "ABLATIONS", "TAIL_RECURSIVE", "tail_recursive", "Construction", "Candidate", "ShortcutSampler",
           "ShortcutConfig", "ValidityLimits", "TraceFrame", "frame_tree", "internal_returns", "child",
           "answer_position", "RootFrame", "root_frame", "root_payload", "CheckResult", "ValidityReport",
           "check_validity", "check_identifiable", "check_not_one_to_one", "check_no_static_literal",
           "ambiguity", "ShortcutDataset", "build_shortcut_dataset", "get_construction", "shortcut_rate",
           "shortcut_summary", "N_IID", "N_OOD", "N_VAL"]

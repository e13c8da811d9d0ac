"""The validity checks a shortcut construction's data must pass (run whenever a data set is
built; a failure raises DataError).

The root frame of an example (`trace.RootFrame`) is what RM's last root frame holds: the root
function, its payload (the bound value of every parameter, literal or returned, in order) and
the local position of its answer.

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

The excluded ablations exist to show that the checks reject them: sibling_copy fails (a),
one_to_one_wrapper fails (b).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from rlmlab.errors import ConfigError, DataError
from rlmlab.shortcuts.construction import Construction
from rlmlab.shortcuts.root_frame import RootFrame


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
    """Check a: RM's root frame determines the answer over training, and no copy or constant
    rule fits training while failing OOD."""
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
    """What RM's root frame could carry S in: the payload without the compensating argument,
    and the parity of the answer's local position."""
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
    """Check b: S is not a function of the root frame's carrier."""
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
    """Check c: no literal position of the written expression holds S on most of training."""
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

"""Aggregates of a recursion's internal returns, and the sibling-copy ablation.

- long_range_aggregate: add(Z, Y), S = (r1 + r2 + r3) mod 10 over the first three internal
  returns of Z. Train Y = (S - z) mod 10 | Y uniform over the other nine digits. S is
  stratified uniform (z keeps its natural distribution over 1..9), so the same z occurs with
  many S (measured by validity check b).
- near_answer_aggregate: as above with the last three internal returns of Z.
- position_weighted_aggregate: as above with S = (sum of positions t of the internal returns
  r_t = 0) mod 10; Z must have at least one zero return.
- sibling_copy (excluded ablation): max(Z1, Z2) with S the long-range aggregate of Z1; train
  keeps z1 <= S and draws a sibling Z2 with value S, so the answer is always the second child's
  value | Z2 is redrawn with a value that makes max(z1, z2) != S. Copying the second child fits
  training and fails OOD: the root frame underdetermines which child to return (validity
  check a rejects it).
"""

from __future__ import annotations

from abc import abstractmethod

from rlmlab.shortcuts.construction import Candidate, Construction, digit_literal, digits_except
from rlmlab.shortcuts.root_frame import child, frame_tree, internal_returns
from rlmlab.task.expr import Call, Expr


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
        y = y_comp if split == "train" else rng.choice(digits_except(y_comp))
        return self.wrap(cand.parts[0], digit_literal(y))


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

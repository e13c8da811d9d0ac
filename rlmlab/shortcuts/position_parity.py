"""Case 2, trace-position parity: S is read from where the answer falls in the trace, not from
any value.

position_parity: is_even(add(Z, Y)), S = "True" if the final answer token's position
(len(tokens) - 2) is even else "False". The position does not depend on the digit Y, so for
each Z, train draws Y uniformly among the five digits that make the answer equal S, OOD
among the five that make it differ. Z is stratified uniformly over the four cells
(z parity, S), which keeps the marginals of Z and of Y identical (Y uniform) in both.
"""

from __future__ import annotations

from rlmlab.shortcuts.construction import Candidate, Construction, digit_literal
from rlmlab.shortcuts.root_frame import answer_position, child, frame_tree
from rlmlab.task.expr import Call, Expr


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
        return self.template(cand.parts[0], digit_literal(rng.choice(ys)))

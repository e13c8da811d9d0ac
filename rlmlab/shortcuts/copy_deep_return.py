"""Case 1, copy the answer from a deep return, and its one-to-one ablation.

- copy_deep_return (Case 1): add(square(square(Z)), Y), S = z. Train Y = (z - z^4) mod 10 so
  the answer is z | Y uniform over the other nine digits. z is stratified uniform over 1..9.
- one_to_one_wrapper (excluded ablation): Case 1 with the injective wrapper multiply(Z, 3): the
  root payload 3z mod 10 is an invertible code for z = S (validity check b rejects it).
"""

from __future__ import annotations

from rlmlab.shortcuts.construction import Candidate, Construction, digit_literal, digits_except
from rlmlab.shortcuts.root_frame import child, frame_tree
from rlmlab.task.expr import Call, Expr


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
        y = y_comp if split == "train" else rng.choice(digits_except(y_comp))
        return self.template(cand.parts[0], digit_literal(y))


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

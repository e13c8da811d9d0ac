"""The hidden intermediate literal: a value a helper binds and the root never sees.

hidden_literal: add(max(multiply(H, 0), V), Y) with the helper H = T(N, W, ...), T
tail-recursive (a Z whose second argument is replaced by a sampled int call W): the helper
binds k = eval(W) (acc, or a for fibonacci) and tail-calls its body with k as an argument
(W takes the accumulator, not the counter, so the recursion length does not grow with k);
multiply(., 0) discards H's value and max(0, v) passes on V's value v, so the root sees
x := v, never k or H's value. S = k. Train Y = (k - v) mod 10 | Y uniform over the digits
other than that and k. Sampled so that k is not a literal of W, v is not 0 and not k, hence
neither the root's literal Y nor the root payload (v, Y) ever shows k (a constant
selector, e.g. multiply(H,0) alone, would force Y = k: S as a root literal).

hidden_literal_late: add(max(V, multiply(H, 0)), Y), the same parts with the helper run last.
The paper states where S must not be (RM's active frames) but not where the helper runs; run
first, k's last occurrence sits a median 131 tokens before the answer; run last, only V's
frame moves ahead of it (`benchmarks/check_hidden_literal.py` measures both distances). A
variant, not one of the paper's six: `rlmlab run shortcuts --constructions hidden_literal_late`.
"""

from __future__ import annotations

from rlmlab.shortcuts.construction import PAPER_TASK, Candidate, Construction, digit_literal, digits_except
from rlmlab.shortcuts.root_frame import child, frame_tree, literal_paths
from rlmlab.task.expr import Call


class HiddenLiteral(Construction):
    """add(max(multiply(H, 0), V), Y), H = T(N, W, ...): S = k = eval(W), bound by the helper."""

    name = "hidden_literal"
    title = "Hidden intermediate literal"
    h_path = (0, 0, 0)  # root -> max -> multiply -> H
    v_path = (0, 1)  # root -> max -> V

    @staticmethod
    def template(h: Call, v: Call, y: str) -> Call:
        return Call("add", (Call("max", (Call("multiply", (h, "0")), v)), y))

    def signal(self, tokens, prompt_len):
        return self.signal_in(frame_tree(tokens, prompt_len))

    def signal_in(self, tree):
        """`signal` of a trace already read into its frame tree (reading it is most of a draw)."""
        # the value the helper binds to its second parameter (acc, or a for fibonacci): the W
        # frame is the helper's second child when its counter argument is a call, else its first
        helper = child(tree, *self.h_path)
        counter = PAPER_TASK.parse(" ".join(helper.call)).args[0]
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
        k = int(self.signal_in(tree))
        v_val = int(child(tree, *self.v_path).value)
        if str(k) in {tok for _, tok in literal_paths(w)} or v_val in (0, k):
            return None  # k must be computed, and must not show in Y (v = 0) or in the payload (v = k)
        return Candidate((h, v), k, {"k": k, "v": v_val})

    def complete(self, cand, split, rng, s):
        k, v = cand.facts["k"], cand.facts["v"]
        y_comp = (k - v) % 10
        y = y_comp if split == "train" else rng.choice(digits_except(y_comp, k))
        return self.template(cand.parts[0], cand.parts[1], digit_literal(y))


class HiddenLiteralLate(HiddenLiteral):
    """add(max(V, multiply(H, 0)), Y): hidden_literal with the helper run after V, so that k is
    bound just before the root's last two returns."""

    name = "hidden_literal_late"
    title = "Hidden intermediate literal, helper last"
    h_path = (0, 1, 0)  # root -> max -> multiply -> H
    v_path = (0, 0)

    @staticmethod
    def template(h: Call, v: Call, y: str) -> Call:
        return Call("add", (Call("max", (v, Call("multiply", (h, "0")))), y))

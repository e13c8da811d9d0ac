"""What a learner reads at the answer of a hidden-literal expression (paper, "Hidden intermediate
literal"; docs/experiments-data.md).

Three teacher-forced greedy predictions of the answer token, each through the learner's own
observation function:

- *in context*: after the whole canonical prefix, k's binding in the helper included (for CoT
  the flattened trace, for RM its root frame);
- *frame alone*: after RM's root frame alone, Pi_rec at the answer point, which never shows k
  (the invariance probe's witness, restricted to the answer);
- *helper swapped*: after the canonical prefix of the same expression with the helper H replaced
  by another expression's helper H' that binds k' != k (and k' != the answer). multiply(., 0)
  discards the helper's value, so the answer, the root payload (v, Y) and everything the root
  computes are unchanged, and only the hidden literal moves. A learner that reads the root
  computation keeps the answer; one that copies the hidden literal answers k'.

On the training distribution (S = k = answer) the first two cannot tell the readings apart;
the swap can: it is the one intervention that separates S from the answer while keeping the
training distribution's root payloads.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from rlmlab.errors import DataError
from rlmlab.learning.observe import observer
from rlmlab.measuring.probe import forced_predictions
from rlmlab.measuring.stats import wilson
from rlmlab.shortcuts.construction import PAPER_TASK
from rlmlab.shortcuts.hidden_literal import HiddenLiteral
from rlmlab.shortcuts.root_frame import answer_position
from rlmlab.task.expr import Call, to_text, value_token
from rlmlab.task.vocab import END_RETURN, Vocab


def split_parts(c: HiddenLiteral, expr: Call) -> tuple[Call, Call, str]:
    """(H, V, Y) of an expression built by `c.template(H, V, Y)`."""
    def at(e, path):
        for i in path:
            if not isinstance(e, Call) or i >= len(e.args):
                return None
            e = e.args[i]
        return e

    h, v, y = at(expr, c.h_path), at(expr, c.v_path), at(expr, (1,))
    if h is None or v is None or y is None or c.template(h, v, y) != expr:
        raise DataError(f"{to_text(expr)} is not a {c.name} expression")
    return h, v, y


def _answer_row(obs, tokens: Sequence[str], prompt_len: int, value: str, vocab: Vocab) -> tuple[list[int], int]:
    """The learner's example that predicts the final answer, cut just after the answer token."""
    ctx, _ = obs.examples(tokens, prompt_len)[-1]
    a = answer_position(ctx)
    if ctx[a] != value or ctx[-1] != END_RETURN:
        raise DataError(f"the last example does not end with the answer {value!r}: {' '.join(ctx[-4:])}")
    return vocab.encode(ctx[:a + 1]), a


def readout(predictor, learner: str, c: HiddenLiteral, rows: Sequence[dict], vocab: Vocab, seed: int = 0,
            max_len: int | None = None) -> list[dict]:
    """One dict per evaluation row (`expr`, `value`, `signal`): the three predictions above as
    tokens ("" where the model could not read the row), the donor expression and its k'.

    Donors are drawn from the same rows, in a seeded order, among those whose k' differs from
    both k and the answer and whose swapped trace fits `max_len` tokens (the model's block);
    a row with no such donor gets `swap_expr` None."""
    obs = observer(learner)
    rng = random.Random(f"rlmlab-readout:{c.name}:{seed}")
    parsed = [PAPER_TASK.parse(r["expr"]) for r in rows]
    parts = [split_parts(c, e) for e in parsed]
    model_rows, swaps = [], []
    for i, (r, e) in enumerate(zip(rows, parsed)):
        ex = PAPER_TASK.execute(e)
        value = value_token(ex.value)
        if value != r["value"]:
            raise DataError(f"{r['expr']}: evaluates to {value}, the record says {r['value']}")
        model_rows.append(_answer_row(obs, ex.tokens, ex.prompt_len, value, vocab))
        root = ex.frames[-1]  # the root's last segment: it writes the answer
        if root.depth != 1:
            raise DataError(f"{r['expr']}: the last active frame is at depth {root.depth}, not the root's")
        model_rows.append(_answer_row(obs, root.tokens, root.m, value, vocab))
        order = list(range(len(rows)))
        rng.shuffle(order)
        swap = None
        for j in order:
            k2 = rows[j]["signal"]
            if k2 in (r["signal"], r["value"]):
                continue
            e2 = c.template(parts[j][0], parts[i][1], parts[i][2])
            ex2 = PAPER_TASK.execute(e2)
            if max_len is not None and len(ex2.tokens) > max_len:
                continue
            if ex2.value != ex.value or c.signal(ex2.tokens, ex2.prompt_len) != k2:
                raise DataError(f"swapping the helper of {r['expr']} changed its value or missed k': {to_text(e2)}")
            swap = (to_text(e2), k2)
            model_rows.append(_answer_row(obs, ex2.tokens, ex2.prompt_len, value, vocab))
            break
        swaps.append(swap)
    preds = [p[0] if p else None for p in forced_predictions(predictor, model_rows)]

    def token(t):
        return vocab.tokens[t] if t is not None and 0 <= t < len(vocab.tokens) else ""

    out, at = [], 0
    for r, swap in zip(rows, swaps):
        d = {"expr": r["expr"], "value": r["value"], "signal": r["signal"],
             "in_context": token(preds[at]), "frame_alone": token(preds[at + 1]),
             "swap_expr": None, "swap_signal": None, "swapped": None}
        at += 2
        if swap is not None:
            d.update(swap_expr=swap[0], swap_signal=swap[1], swapped=token(preds[at]))
            at += 1
        out.append(d)
    return out


def readout_summary(rows: Sequence[dict]) -> dict:
    """Counts with 95% Wilson intervals: answer and S in context, the frame-alone answer and its
    agreement with the in-context one, and the swapped prediction against the answer, k' and k."""
    def share(hits: int, n: int) -> dict:
        return {"k": hits, "n": n, "rate": hits / n if n else None, "ci95": list(wilson(hits, n)) if n else None}

    n = len(rows)
    sw = [r for r in rows if r["swap_expr"] is not None]
    return {
        "n": n,
        "in_context_answer": share(sum(r["in_context"] == r["value"] for r in rows), n),
        "in_context_signal": share(sum(r["in_context"] == r["signal"] for r in rows), n),
        "frame_alone_answer": share(sum(r["frame_alone"] == r["value"] for r in rows), n),
        "frame_agrees": share(sum(r["frame_alone"] == r["in_context"] for r in rows), n),
        "swapped_answer": share(sum(r["swapped"] == r["value"] for r in sw), len(sw)),
        "swapped_new_signal": share(sum(r["swapped"] == r["swap_signal"] for r in sw), len(sw)),
        "swapped_old_signal": share(sum(r["swapped"] == r["signal"] for r in sw), len(sw)),
    }

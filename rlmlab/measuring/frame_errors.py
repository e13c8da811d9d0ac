"""Where a learner errs: teacher-forced errors per active-frame example, and whether the frame
was one the training split showed.

Every generated token of a canonical trace is the target of exactly one active-frame example
(one per push, one per pop, one at the end: `rlmlab.task.frames.cut_examples`), so any learner's
teacher-forced predictions can be scored frame example by frame example: RM reads the example
itself, CoT the whole prefix up to it. An example is *wrong* when any of its targets is
mispredicted. Grouped by the frame's function and by whether the frame's call (the text at the
top of the frame, e.g. `factorial ( 9 , 1 )`) occurs among the frames of the training traces,
this separates errors on frames the learner has seen, in longer or deeper traces, from errors
on frames that are themselves new. For RM the two differ in kind: an example's context is its
frame, so a length split only ever shifts what RM reads through the frames it contains.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from rlmlab.measuring.stats import share
from rlmlab.task.library import Library
from rlmlab.task.trace import Execution, execute
from rlmlab.task.vocab import Vocab

ALL = "all"  # the function label of the row that pools every function


def frame_call(context: Sequence[str]) -> str:
    """The call at the top of a frame: its function name through the matching parenthesis."""
    depth = 0
    for j, tok in enumerate(context):
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
            if depth == 0:
                return " ".join(context[:j + 1])
    raise ValueError(f"not a frame: no complete call at the top of {' '.join(context[:20])!r}")


def training_calls(exprs: Iterable, library: Library) -> set[str]:
    """The calls of every frame of these expressions' traces (what the training split showed)."""
    return {frame_call(f.context) for e in exprs for f in execute(e, library).frames}


def frame_records(model, vocab: Vocab, learner: str, executions: Sequence[Execution],
                  seen: set[str] | None = None, extra: Sequence[dict] | None = None,
                  max_tokens: int = 16384, progress=None) -> list[dict]:
    """One dict per active-frame example of every execution: its expression (`expr_index`), its
    place among the expression's examples (`example`), function, call, depth, context and
    target lengths, the trace position of its first target (`start`: where CoT reads it), the
    number of mispredicted targets and the offset of the first, whether the call is in `seen`
    (when given), and the expression's `extra` columns (bins, OOD flags)."""
    from rlmlab.measuring.score import (
        per_token_hits,  # the model pass; the tables below need no torch
    )

    hits = per_token_hits(model, vocab, learner, executions, max_tokens, progress)
    out = []
    for i, (ex, h) in enumerate(zip(executions, hits)):
        offset = 0
        for k, f in enumerate(ex.frames):
            mine = h[offset:offset + len(f.targets)]
            offset += len(f.targets)
            wrong = (~mine).nonzero()[0]
            call = frame_call(f.context)
            r = {"expr_index": i, "example": k, "fn": f.context[0], "call": call, "depth": f.depth, "m": f.m,
                 "targets": len(f.targets), "start": ex.prompt_len + offset - len(f.targets),
                 "errors": int(len(wrong)), "first_error": int(wrong[0]) if len(wrong) else None}
            if seen is not None:
                r["seen"] = call in seen
            if extra is not None:
                r.update(extra[i])
            out.append(r)
        if offset != len(h):  # the examples' targets are the generated tokens, in order
            raise AssertionError(f"frame targets cover {offset} of {len(h)} generated tokens of {ex.text}")
    return out


def summarize_frames(records: Sequence[dict], by: str | None = None) -> list[dict]:
    """Wrong-example rates with 95% Wilson intervals per group (values of column `by`, in order of
    first appearance; one group when None) and function (all functions first, then by count),
    split by `seen` when the records have it. Each row: group, fn, seen (None: both), n, wrong,
    rate, ci95."""
    groups: dict = defaultdict(list)
    for r in records:
        groups[r.get(by) if by else None].append(r)
    rows = []
    for group, rs in groups.items():
        by_fn: dict = defaultdict(list)
        for r in rs:
            by_fn[r["fn"]].append(r)
        for fn, fr in [(ALL, rs), *sorted(by_fn.items(), key=lambda kv: (-len(kv[1]), kv[0]))]:
            splits = [(None, fr)]
            if fr and "seen" in fr[0]:
                splits += [(True, [r for r in fr if r["seen"]]), (False, [r for r in fr if not r["seen"]])]
            for seen, part in splits:
                s = share(sum(r["errors"] > 0 for r in part), len(part))
                rows.append({"group_by": by, "group": group, "fn": fn, "seen": seen, "n": s["n"],
                             "wrong": s["correct"], "rate": s["accuracy"] if part else None, "ci95": s["ci95"]})
    return rows


def render_frames(rows: Sequence[dict], top: int | None = None) -> str:
    """A Markdown table: per function, per group its examples and wrong share (%), then (when
    known) the share of examples whose call training showed and the wrong share on each side."""
    groups = list(dict.fromkeys(r["group"] for r in rows))
    has_seen = any(r["seen"] is not None for r in rows)
    cell = {(r["group"], r["fn"], r["seen"]): r for r in rows}
    fns = list(dict.fromkeys(r["fn"] for r in rows if r["group"] == groups[-1]))
    fns += [f for f in dict.fromkeys(r["fn"] for r in rows) if f not in fns]
    if top is not None:
        fns = fns[:top + 1]  # "all" and the `top` most frequent
    by = rows[0]["group_by"]

    def label(group) -> str:
        if by == "ood":
            return "OOD" if group else "IID"
        return f"{by}={group}" if by else ""

    head = ["function"]
    for g in groups:
        head += [f"{label(g)} examples".strip(), f"{label(g)} wrong (%)".strip()]
        if has_seen:
            head += [f"{label(g)} seen in training (%)".strip(), f"{label(g)} wrong if seen (%)".strip(),
                     f"{label(g)} wrong if unseen (%)".strip()]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]

    def pct(r):
        return "–" if r is None or r["rate"] is None else f"{100 * r['rate']:.2f}"

    for fn in fns:
        out = [fn]
        for g in groups:
            both = cell.get((g, fn, None))
            out += [str(both["n"]) if both else "0", pct(both)]
            if has_seen:
                yes, no = cell.get((g, fn, True)), cell.get((g, fn, False))
                out += ["–" if not both or not both["n"] else f"{100 * yes['n'] / both['n']:.1f}", pct(yes), pct(no)]
        lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)

"""The invariance probe (paper, "Invariance Under an Observation Function", theorem "Shortcut
Forces Non-Invariance"): does a learner's behaviour depend on more than the active frame?

Two levels, for a predictor run through its own observation (CoT: the whole sequence; RM: the active
frame; any observation of `rlmlab.learning.observe`):

- position level: at every prediction point t of every canonical trace x, the greedy next
  token on the complete prefix x_t against the one on Pi_rec(x_t) posed alone, the theorem's
  witness x_te := Pi_rec(x_t). (Through an observation V the predictor reads V(x_t) and
  V(Pi_rec(x_t)).) Both sides are teacher-forced: the learner's examples of the trace once,
  and each active-frame example once (the points of one frame segment read prefixes of it).
  A point is *non-invariant* if the two tokens differ; a *witness* if in addition the
  prediction in context is the true next token (the theorem's x with f(x) = g*(Pi(x))).
- answer level: the predictor's own greedy trace of each expression is replayed; for every
  completed call (a `</call>` answered by the child's `</return>`), the value returned in
  context is compared with the value the predictor returns when the payload is posed alone
  as a root problem (all such decodings batched through `generate`). Payloads that do not
  parse as a call are counted (`unparsed`) and skipped.

For RM both rates are zero by construction: its observation of x_t *is* Pi_rec(x_t), and a child
frame decodes exactly as the same call decodes as a root.

`probe(...)` returns one dict per expression; `summarize_probe(rows, by)` the rates overall and
per group, with 95% Wilson intervals (points and subproblems counted as independent trials:
points of one trace are not, so read the interval as a lower bound on the uncertainty);
`probe_summary(rows)` the overall figures a report puts next to accuracy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from rlmlab.decoding.driver import Limits, generate
from rlmlab.decoding.predictor import NO_TOKEN, Feed, Predictor
from rlmlab.errors import ConfigError, RlmlabError
from rlmlab.learning.observe import NEW, observer
from rlmlab.measuring.stats import wilson
from rlmlab.measuring.teacher import Row, teacher_forced_argmax
from rlmlab.task.event_stream import Pop, Push, events
from rlmlab.task.expr import Call, parse, to_text, value_token
from rlmlab.task.library import Library
from rlmlab.task.trace import execute, trace_stats
from rlmlab.task.vocab import Vocab

# A progress reporter: stage(name, total, unit) returns the callback that counts items done.
Stage = Callable[[str, int, str], Callable[[int], None]]


def _bar(stage: Stage | None, name: str, total: int, unit: str = "row") -> Callable[[int], None] | None:
    return None if stage is None else stage(name, total, unit)


# --- teacher-forced greedy predictions ------------------------------------------------------


def forced_predictions(predictor: Predictor, rows: Sequence[Row], batch_size: int = 64,
                       max_tokens: int = 16384, progress: Callable[[int], None] | None = None) -> list[list[int]]:
    """out[r][j]: the predictor's greedy token after reading rows[r].ids[:m + j], for every
    target j of row r.

    A `ModelPredictor` (anything with a `.model`) runs each row once, teacher-forced, rows
    batched by length up to `max_tokens` padded tokens; a point beyond the model's block size
    gets NO_TOKEN. Any other predictor (the oracles) is walked along each row with the
    driver's own feeds: the context, then one more token per step (event NEW, then keep =
    all but the newest token), `batch_size` rows at once in slots.
    """
    model = getattr(predictor, "model", None)
    if model is not None:
        if getattr(model.cfg, "position_index", None) is not None:
            # Its rows are read at 0..n-1; which places a frame read alone should take under
            # another index is a question of its own (docs/positions.md).
            raise ConfigError(f"the invariance probe reads models at their learner's own positions, not "
                              f"model.position_index={model.cfg.position_index}")
        return teacher_forced_argmax(model, rows, max_tokens, progress)
    out = _walked_predictions(predictor, rows, batch_size)
    if progress is not None:
        progress(len(rows))
    return out


def _walked_predictions(predictor: Predictor, rows: Sequence[Row], batch_size: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in rows]
    todo = iter(r for r in range(len(rows)) if len(rows[r][0]) > rows[r][1])
    n_slots = max(1, min(batch_size, len(rows)))
    predictor.reset(n_slots)
    block = predictor.block_size
    slots: list[int | None] = [None] * n_slots  # row index per slot
    fresh = [True] * n_slots
    while True:
        for s in range(n_slots):
            if slots[s] is None:
                slots[s] = next(todo, None)
                fresh[s] = True
        feeds = []
        for s, r in enumerate(slots):
            if r is None:
                continue
            ids, m = rows[r]
            n = m + len(out[r])  # tokens read this step
            if block is not None and n > block:  # unreadable: as in generation, no token
                out[r].extend([NO_TOKEN] * (len(ids) - n))
                slots[s] = next(todo, None)
                fresh[s] = True
                continue
            feeds.append(Feed(s, list(ids[:n]), 0 if fresh[s] else n - 1, NEW if fresh[s] else None))
            fresh[s] = False
        if not feeds:
            if any(r is not None for r in slots):
                continue  # slots refilled after unreadable rows
            return out
        for f, t in zip(feeds, predictor(feeds)):
            r = slots[f.slot]
            out[r].append(t)
            if len(out[r]) == len(rows[r][0]) - rows[r][1]:
                slots[f.slot] = None


# --- position level -------------------------------------------------------------------------


def position_probe(predictor: Predictor, learner: str, exprs: Sequence[Call], vocab: Vocab,
                   batch_size: int = 64, stage: Stage | None = None, *, library: Library) -> list[dict]:
    """Per expression: prediction points, how many are non-invariant, how many of those are
    witnesses (right in context), and how many are right in context."""
    obs = observer(learner)
    left: list[Row] = []
    right: list[Row] = []
    spans = []  # per expression: (left rows [a, b), right rows [c, d), canonical targets)
    for e in exprs:
        ex = execute(e, library)
        a, c = len(left), len(right)
        left.extend((vocab.encode(t), m) for t, m in obs.examples(ex.tokens, ex.prompt_len))
        for f in ex.frames:  # Pi_rec(x_t) for the points of one segment: prefixes of f.tokens
            right.extend((vocab.encode(t), m) for t, m in obs.examples(f.tokens, f.m))
        spans.append((a, len(left), c, len(right), vocab.encode(ex.tokens[ex.prompt_len:])))
    in_context = forced_predictions(predictor, left, batch_size, progress=_bar(stage, "probe: in context", len(left)))
    alone = forced_predictions(predictor, right, batch_size, progress=_bar(stage, "probe: frames alone", len(right)))
    out = []
    for a, b, c, d, truth in spans:
        p = [t for r in range(a, b) for t in in_context[r]]
        q = [t for r in range(c, d) for t in alone[r]]
        assert len(p) == len(q) == len(truth), "a learner's examples must cover every prediction point once"
        differ = [x != y for x, y in zip(p, q)]
        right_ = [x == y for x, y in zip(p, truth)]
        out.append({"positions": len(truth), "position_differ": sum(differ),
                    "position_correct": sum(right_),
                    "witnesses": sum(dx and rx for dx, rx in zip(differ, right_))})
    return out


# --- answer level ---------------------------------------------------------------------------


def completed_calls(tokens: Sequence[str], prompt_len: int) -> list[tuple[str, str, int]]:
    """The completed calls of a (possibly invalid) trace, in the order they return: (payload
    q as written, returned payload a, depth of the child). The events stop at the first
    illegal token. The returned payload is the frame's (a child's value already appended),
    not the flattened trace's text between <return> and </return>."""
    payloads: list[tuple[str, ...]] = []
    out = []
    for e in events(tokens, prompt_len, errors="stop"):
        if type(e) is Push:
            payloads.append(e.call)
        elif type(e) is Pop and e.depth > 1:
            out.append((" ".join(payloads.pop()), " ".join(e.value), e.depth))
    return out


def answer_probe(predictor: Predictor, learner: str, exprs: Sequence[Call], vocab: Vocab,
                 limits: Limits = Limits(), batch_size: int = 64, stage: Stage | None = None,
                 *, library: Library) -> list[dict]:
    """Per expression: completed subproblems of the predictor's greedy trace, how many return
    another value when posed alone, how many payloads did not parse, and how often the value
    was right in context and alone."""
    gens = generate(predictor, exprs, vocab, learner, limits, batch_size,
                    progress=_bar(stage, "probe: greedy traces", len(exprs), "expr"), library=library)
    calls_per_expr = [completed_calls(g.tokens, g.prompt_len) for g in gens]
    standalone: dict[str, Call | None] = {}
    for calls in calls_per_expr:
        for q, _, _ in calls:
            if q not in standalone:
                try:
                    e = parse(q, library)
                except RlmlabError:
                    e = None
                standalone[q] = e if isinstance(e, Call) else None
    posed = [q for q, e in standalone.items() if e is not None]
    alone_gens = generate(predictor, [standalone[q] for q in posed], vocab, learner, limits, batch_size,
                          progress=_bar(stage, "probe: subproblems alone", len(posed), "expr"),
                          library=library) if posed else []
    alone = {q: g.answer for q, g in zip(posed, alone_gens)}
    truth = {q: value_token(trace_stats(standalone[q], library).value) for q in posed}
    out = []
    for g, calls in zip(gens, calls_per_expr):
        ok = [(q, a) for q, a, _ in calls if standalone[q] is not None]
        out.append({"generated_valid": g.valid, "subproblems": len(ok), "unparsed": len(calls) - len(ok),
                    "answer_differ": sum(alone[q] != a for q, a in ok),
                    "in_context_correct": sum(a == truth[q] for q, a in ok),
                    "alone_correct": sum(alone[q] == truth[q] for q, a in ok)})
    return out


# --- both, and summaries --------------------------------------------------------------------


def probe(predictor: Predictor, learner: str, exprs: Sequence[Call | str], vocab: Vocab,
          extra: Sequence[dict] | None = None, limits: Limits = Limits(), batch_size: int = 64,
          position_level: bool = True, answers: bool = True, stage: Stage | None = None,
          *, library: Library) -> list[dict]:
    """Both levels of the probe, one dict per expression (with `extra`'s columns, e.g. a pool's
    `bin`, `split`, `construction`, for grouping). `stage(name, total, unit)` opens a progress report
    for each of its four passes and returns the callback that counts items done."""
    calls = [e if isinstance(e, Call) else parse(e, library) for e in exprs]
    rows = [{"expr": to_text(e), **(extra[i] if extra else {})} for i, e in enumerate(calls)]
    if position_level:
        for row, p in zip(rows, position_probe(predictor, learner, calls, vocab, batch_size, stage, library=library)):
            row.update(p)
    if answers:
        for row, a in zip(rows, answer_probe(predictor, learner, calls, vocab, limits, batch_size, stage, library=library)):
            row.update(a)
    return rows


def _rates(rows: Sequence[dict]) -> dict:
    out: dict = {"n_expressions": len(rows)}
    if rows and "positions" in rows[0]:
        n, k = sum(r["positions"] for r in rows), sum(r["position_differ"] for r in rows)
        nc, w = sum(r["position_correct"] for r in rows), sum(r["witnesses"] for r in rows)
        out.update(positions=n, position_non_invariant=k, position_rate=k / n if n else None,
                   position_ci95=list(wilson(k, n)), position_correct=nc, witnesses=w,
                   witness_rate=w / nc if nc else None, witness_ci95=list(wilson(w, nc)))
    if rows and "subproblems" in rows[0]:
        n, k = sum(r["subproblems"] for r in rows), sum(r["answer_differ"] for r in rows)
        out.update(subproblems=n, answer_non_invariant=k, answer_rate=k / n if n else None,
                   answer_ci95=list(wilson(k, n)), unparsed=sum(r["unparsed"] for r in rows),
                   in_context_correct=sum(r["in_context_correct"] for r in rows),
                   alone_correct=sum(r["alone_correct"] for r in rows))
    return out


def summarize_probe(rows: Sequence[dict], by: Sequence[str] = ()) -> list[dict]:
    """The rates overall (group_by None) and per value of each column in `by` (values in order
    of first appearance in `rows`), as a list of
    dicts: position_rate (non-invariant points / points), witness_rate (non-invariant points
    right in context / points right in context), answer_rate (subproblems answered otherwise
    alone / subproblems), each with a 95% Wilson interval."""
    out = [{"group_by": None, "group": None, **_rates(rows)}]
    for key in by:
        groups: dict = defaultdict(list)
        for r in rows:
            groups[r.get(key)].append(r)
        for value in groups:  # in order of first appearance: a split's bins are stored in bin order
            out.append({"group_by": key, "group": value, **_rates(groups[value])})
    return out


def probe_summary(rows: Sequence[dict]) -> dict:
    """The overall figures, for a report column next to accuracy: position_rate,
    position_ci95, witness_rate, answer_rate, answer_ci95, and their counts."""
    return summarize_probe(rows)[0]


"""Scoring: final-answer accuracy, teacher-forced per-token accuracy, per-expression results.

Every metric is a pure function of the per-expression result dicts that `expression_results`
builds and `write_results` saves, so per-bin tables, shortcut rates or any other grouping can
be recomputed from a results file without rerunning a model.

- Final-answer accuracy: the root's returned payload equals the true value token; an invalid
  trace counts as wrong. 95% Wilson score intervals (paper appendix, "Evaluation").
- Per-token accuracy (paper appendix, IID setup): at every eligible position the model reads
  the true prefix and its argmax is compared with the true next token. CoT: the positions
  after the prompt of the flattened trace; RM: the targets of every active-frame example;
  any other observation (`rlmlab.learning.observe`): the targets of its training examples.
  The interval is a bootstrap over expressions, not over tokens.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from rlmlab.attention.position_index import example_positions
from rlmlab.decoding.driver import Generation, Limits, generate
from rlmlab.decoding.engine import ModelPredictor
from rlmlab.errors import ConfigError, DataError, RlmlabError
from rlmlab.learning.learner import as_learner
from rlmlab.learning.observe import observer
from rlmlab.measuring.result_files import write_results
from rlmlab.measuring.stats import summarize
from rlmlab.measuring.teacher import teacher_forced_argmax
from rlmlab.safeio import json_safe, read_bytes, refuse_symlinks, regular_file
from rlmlab.task.expr import Call, parse, value_token
from rlmlab.task.pool import read_pool
from rlmlab.task.taskfile import Task
from rlmlab.task.trace import Execution, execute, trace_stats
from rlmlab.task.vocab import Vocab

# Data columns carried into results: JSON scalars (a binary or nested column is not).
PLAIN_COLUMN = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_string,
                pa.types.is_large_string)
MAX_EXPRESSION_FILE = 1 << 30  # a text file of expressions; bigger ones belong in parquet


def per_token_hits(model, vocab: Vocab, learner: str, executions: Sequence[Execution],
                   max_tokens: int = 16384, progress=None) -> list[np.ndarray]:
    """Teacher-forced hits for `learner`: per expression a boolean array over its generated tokens
    (the trace after the written expression), in trace order.

    Every generated token is the target of exactly one of the learner's examples (CoT: one per
    trace; RM: one per active-frame example), and the examples cover the trace in order, so
    their targets concatenate to the generated tokens. An eligible position the model cannot
    read (beyond its block size) counts as wrong, as it would be in generation.
    """
    obs = observer(learner)
    index = getattr(model.cfg, "position_index", None)
    rows, owner, places = [], [], []
    for i, ex in enumerate(executions):
        examples = obs.examples(ex.tokens, ex.prompt_len)
        at = example_positions(obs.name, index, ex.tokens, ex.prompt_len)
        for k, (toks, m) in enumerate(examples):
            rows.append((vocab.encode(toks), m))
            owner.append(i)
            if at is not None:
                places.append(at[k])
    predicted = teacher_forced_argmax(model, rows, max_tokens, progress, places if places else None)
    parts: list[list[np.ndarray]] = [[] for _ in executions]
    for i, (ids, m), pred in zip(owner, rows, predicted):
        parts[i].append(np.asarray(pred, dtype=np.int64) == np.asarray(ids[m:], dtype=np.int64))
    return [np.concatenate(p) if p else np.zeros(0, dtype=bool) for p in parts]


def per_token_counts(model, vocab: Vocab, learner: str, executions: Sequence[Execution],
                     max_tokens: int = 16384) -> list[tuple[int, int]]:
    """Teacher-forced (correct, eligible) per expression for `learner` (`per_token_hits` summed)."""
    return [(int(h.sum()), len(h)) for h in per_token_hits(model, vocab, learner, executions, max_tokens)]


# The fields of every result dict (plus tf_correct/tf_total with per-token counts, trace when
# asked for, and the data file's own columns such as a pool's id).
RESULT_FIELDS = ("expr", "root", "value", "prediction", "correct", "valid", "reason", "trace_len", "max_depth",
                 "n_frame_examples", "max_frame_width", "generated", "pred_trace_len", "pred_max_depth",
                 "pred_n_frame_examples", "fed", "trace_exact", "diverge_at")


def expression_results(gens: Sequence[Generation], executions: Sequence[Execution],
                       per_token: Sequence[tuple[int, int]] | None = None,
                       extra: Sequence[dict] | None = None, traces: bool | str = False) -> list[dict]:
    """One flat dict per expression: the truth, the prediction, and what the decoding did.
    `traces`: True keeps every produced trace (`trace`, space-joined), "inexact" only those that
    differ from the canonical trace (an exact one is the executor's), False none."""
    if traces not in (False, True, "inexact"):
        raise ValueError(f"traces must be False, True or 'inexact', got {traces!r}")
    out = []
    for k, (g, ex) in enumerate(zip(gens, executions)):
        produced = tuple(g.tokens)
        exact = produced == ex.tokens
        diverge = None
        if not exact:
            diverge = next((j for j, (a, b) in enumerate(zip(produced, ex.tokens)) if a != b),
                           min(len(produced), len(ex.tokens)))
        r = {
            "expr": ex.text, "root": ex.expr.fn, "value": ex.value_token, "prediction": g.answer,
            "correct": g.valid and g.answer == ex.value_token, "valid": g.valid, "reason": g.reason,
            "trace_len": ex.trace_len, "max_depth": ex.max_depth, "n_frame_examples": ex.n_frame_examples,
            "max_frame_width": ex.max_frame_width,
            "generated": g.n_generated, "pred_trace_len": len(produced), "pred_max_depth": g.max_depth,
            "pred_n_frame_examples": g.n_frame_examples, "fed": g.fed, "trace_exact": exact, "diverge_at": diverge,
        }
        if per_token is not None:
            r["tf_correct"], r["tf_total"] = per_token[k]
        if traces is True or (traces == "inexact" and not exact):
            r["trace"] = " ".join(produced)
        if extra is not None:
            r.update(extra[k])
        out.append(r)
    return out


def read_expressions(path: str | Path, limit: int | None = None, *, task: Task) -> tuple[list[Call], list[dict]]:
    """Expressions of `task` to evaluate: a parquet file with an `expr`
    column (a pool: its `id` column is kept with each result; a pool of another task is
    refused) or a text file with one written expression per line (blank lines and lines
    starting with # are skipped). Returns (parsed calls, per-expression extras)."""
    path = regular_file(path, DataError, "data file")  # a FIFO or a device would block or never end
    if path.suffix == ".parquet":
        table = read_pool(path, task=task)
        if limit is not None:
            table = table.slice(0, limit)
        texts = table.column("expr").to_pylist()
        ids = None
        if "id" in table.column_names:
            kind = table.schema.field("id").type
            if not any(t(kind) for t in PLAIN_COLUMN):
                raise DataError(f"{path}: the 'id' column holds {kind}, not numbers or strings")
            ids = [json_safe(i) for i in table.column("id").to_pylist()]
        where = [f"row {i}" for i in range(len(texts))]
    else:
        try:
            lines = read_bytes(path, DataError, "file of expressions", MAX_EXPRESSION_FILE).decode().splitlines()
        except UnicodeDecodeError:
            raise DataError(f"{path}: not a text file of expressions (or a .parquet pool)") from None
        numbered = [(n, s.strip()) for n, s in enumerate(lines, 1) if s.strip() and not s.lstrip().startswith("#")]
        numbered = numbered[:limit] if limit is not None else numbered
        texts = [s for _, s in numbered]
        where = [f"line {n}" for n, _ in numbered]
        ids = None
    exprs = []
    for text, w in zip(texts, where):
        try:
            e = task.parse(text)
        except RlmlabError as err:
            raise DataError(f"{path}: {w}: {err}") from None
        if not isinstance(e, Call):
            raise DataError(f"{path}: {w}: {text!r} is a literal, not a call")
        exprs.append(e)
    if not exprs:
        raise DataError(f"{path}: no expressions")
    extra = [{"id": i} for i in ids] if ids is not None else [{} for _ in exprs]
    return exprs, extra


def data_columns(path: str | Path, n: int) -> list[dict]:
    """Per expression, the first `n` rows' columns of a parquet data file other than `expr`
    (JSON-safe scalars only: bins, splits, ids, signals); a text file has none."""
    if Path(path).suffix != ".parquet":
        return [{} for _ in range(n)]
    import pyarrow.parquet as pq

    table = pq.read_table(path).slice(0, n)
    keep = [c for c in table.column_names if c != "expr" and any(t(table.schema.field(c).type) for t in PLAIN_COLUMN)]
    cols = {c: [json_safe(v) for v in table.column(c).to_pylist()] for c in keep}
    return [{c: cols[c][i] for c in keep} for i in range(n)]


def read_grouped(path: str | Path, limit: int | None, by: Sequence[str] | None, default_by: Sequence[str],
                 per_group: int | None = None, *, task: Task) -> tuple[list[Call], list[dict], list[str]]:
    """Expressions with their data columns, for a command that groups its figures by columns:
    `by` (default: those of `default_by` the data has) is checked against the data, and with
    `per_group` only the first that many expressions of each group of the first column are kept.
    Returns (expressions, their columns, the grouping columns)."""
    exprs, _ = read_expressions(path, limit, task=task)
    extra = data_columns(path, len(exprs))
    by = list(by) if by is not None else [c for c in default_by if c in extra[0]]
    for c in by:
        if c not in extra[0]:
            raise ConfigError(f"--by {c}: no such column in {path} (have: {', '.join(extra[0]) or 'none'})")
    if per_group is not None:
        if not by:
            raise ConfigError(f"--per-group needs a column to group by (--by, or data with a column of: "
                              f"{', '.join(default_by)})")
        taken: Counter = Counter()
        keep = []
        for i, e in enumerate(extra):
            if taken[e[by[0]]] < per_group:
                taken[e[by[0]]] += 1
                keep.append(i)
        exprs, extra = [exprs[i] for i in keep], [extra[i] for i in keep]
    return exprs, extra, by


def decode_and_score(predictor, learner: str, exprs: Sequence[Call], vocab: Vocab, limits: Limits | None = None,
                     batch_size: int | None = None, model=None, extra: Sequence[dict] | None = None,
                     traces: bool | str = False, progress=None, n_boot: int = 2000,
                     *, task: Task) -> tuple[list[dict], dict]:
    """Greedy-decode `exprs` (of `task`) with `predictor` as `learner` reads them and score
    them; with `model`, add teacher-forced per-token accuracy. Returns (per-expression results in
    input order, summary)."""
    library = task.library
    executions = [execute(e, library) for e in exprs]
    t0 = time.perf_counter()
    who = as_learner(learner)  # a learner with its own encoding ("cot@rope") reads as its base learner
    gens = generate(predictor, exprs, vocab, who, limits or Limits(), batch_size, progress, library=library)
    seconds = time.perf_counter() - t0
    tf = per_token_counts(model, vocab, who, executions) if model is not None else None
    results = expression_results(gens, executions, tf, extra, traces)
    summary = summarize(results, n_boot)
    summary.update(learner=who.name, seconds=seconds, expr_per_s=len(exprs) / seconds if seconds else None,
                   tokens_per_s=summary["generated_tokens"] / seconds if seconds else None)
    return results, summary


def evaluate_file(out_dir: str | Path, predictor, learner: str, data: str | Path, vocab: Vocab, *,
                  model=None, limits: Limits | None = None, batch_size: int | None = None, limit: int | None = None,
                  columns: Sequence[str] = (), traces: bool | str = "inexact", progress=None,
                  header: dict | None = None, task: Task) -> tuple[list[dict], dict]:
    """Decode and score the expressions of a data file and write `results.parquet` and
    `summary.json` to `out_dir`: the one evaluation path of `rlmlab eval` and `rlmlab run`.

    Each result carries the expression's pool `id`, or, when the data file has any of `columns`
    (bins, OOD flags, signals), those columns instead. With `model`, teacher-forced per-token
    accuracy is added. The summary holds `header`, the data path, the scores and the limits."""
    refuse_symlinks(out_dir, "evaluation folder")  # checked before minutes of decoding
    exprs, extra = read_expressions(data, limit, task=task)
    if columns:
        picked = [{c: row[c] for c in columns if c in row} for row in data_columns(data, len(exprs))]
        extra = picked if any(picked) else extra
    limits = limits or Limits()
    results, summary = decode_and_score(predictor, learner, exprs, vocab, limits, batch_size, model=model,
                                        extra=extra, traces=traces, progress=progress, task=task)
    if not task.is_paper:  # a paper summary keeps the form it had before tasks were recorded
        header = {**(header or {}), "task": {**task.identity, "spec": task.spec}}
    summary = {**(header or {}), "data": str(data), **summary,
               "limits": {"max_depth": limits.max_depth, "max_frame_tokens": limits.max_frame_tokens,
                          "max_new_tokens": limits.max_new_tokens, "runaway_factor": limits.runaway_factor}}
    write_results(out_dir, results, summary)
    return results, summary


def answer_accuracy_fn(exprs: Sequence[Call | str], batch_size: int | None = None, limits: Limits | None = None,
                       *, task: Task):
    """A `validate_fn` for `rlmlab.learning.train`: greedy final-answer accuracy on `exprs` ("answer_acc",
    the metric "auto" checkpoint selection picks) and the share of valid traces ("answer_valid").
    By default a row may generate twice the set's longest canonical trace, so that an untrained
    model's runaway rows do not make early validations slow."""
    library = task.library
    exprs = [e if isinstance(e, Call) else parse(e, library) for e in exprs]
    stats = [trace_stats(e, library) for e in exprs]
    values = [value_token(s.value) for s in stats]
    limits = limits or Limits(max_new_tokens=2 * max(s.trace_len for s in stats))

    def validate(model, vocab: Vocab, learner: str) -> dict:
        gens = generate(ModelPredictor(model), exprs, vocab, learner, limits, batch_size, library=library)
        right = sum(g.valid and g.answer == v for g, v in zip(gens, values))
        return {"answer_acc": right / len(exprs), "answer_valid": sum(g.valid for g in gens) / len(exprs)}

    return validate

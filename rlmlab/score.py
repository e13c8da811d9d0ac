"""Scoring: final-answer accuracy, teacher-forced per-token accuracy, per-expression results.

Every metric is a pure function of the per-expression result dicts that `expression_results`
builds and `write_results` saves, so per-bin tables, shortcut rates or any other grouping can
be recomputed from a results file without rerunning a model.

- Final-answer accuracy: the root's returned payload equals the true value token; an invalid
  trace counts as wrong. 95% Wilson score intervals (paper appendix, "Evaluation").
- Per-token accuracy (paper appendix, IID setup): at every eligible position the model reads
  the true prefix and its argmax is compared with the true next token. CoT: the positions
  after the prompt of the flattened trace; RM: the targets of every active-frame example;
  any other observation (`rlmlab.observe`): the targets of its training examples.
  The interval is a bootstrap over expressions, not over tokens.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from rlmlab.errors import ConfigError, DataError, RlmlabError
from rlmlab.expr import Call, parse, value_token
from rlmlab.infer import Generation, Limits, ModelPredictor, generate
from rlmlab.observe import observer
from rlmlab.pool import read_pool
from rlmlab.trace import Execution, execute, trace_stats
from rlmlab.vocab import Vocab

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (n = 0 gives (0, 1))."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # The bounds at k = 0 and k = n are exactly 0 and 1; say so rather than 1 - 1e-16.
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], n_boot: int = 2000, level: float = 0.95,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile interval of sum(num)/sum(den) when whole samples (expressions) are resampled
    with replacement: tokens of one expression stay together."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = len(num)
    if n == 0 or den.sum() == 0:
        return 0.0, 1.0
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    chunk = max(1, 2_000_000 // n)  # resample in blocks to bound memory
    for s in range(0, n_boot, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_boot - s), n))
        d = den[idx].sum(1)
        stats[s:s + len(idx)] = np.divide(num[idx].sum(1), d, out=np.zeros(len(idx)), where=d > 0)
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))


@torch.no_grad()
def per_token_hits(model, vocab: Vocab, view: str, executions: Sequence[Execution],
                   max_tokens: int = 16384) -> list[np.ndarray]:
    """Teacher-forced hits for `view`: per expression a boolean array over its generated tokens
    (the trace after the written expression), in trace order.

    Rows (CoT: one per trace; RM: one per active-frame example, from position 0) are sorted by
    length and batched up to `max_tokens` padded tokens. Every generated token is the target of
    exactly one row, and rows cover the trace in order, so row targets land at fixed offsets.
    An eligible position the model cannot read (beyond its block size) counts as wrong, as it
    would be in generation.
    """
    obs = observer(view)
    block = model.cfg.block_size
    device = next(model.parameters()).device
    rows: list[tuple[int, list[int], int, int]] = []  # (expression, token ids, first target, its offset)
    hits = []
    for i, ex in enumerate(executions):
        if obs.name == "rm":  # the executor has already cut the active-frame examples
            segments = [(f.tokens, f.m) for f in ex.frames]
        else:  # the observation's examples: CoT one per trace, a window one per target, ...
            segments = obs.examples(ex.tokens, ex.prompt_len)
        offset = 0
        for toks, m in segments:
            rows.append((i, vocab.encode(toks), m, offset))
            offset += len(toks) - m
        hits.append(np.zeros(offset, dtype=bool))
    # Token j is predicted from positions [0, j): with a block of B positions tokens up to B
    # can be scored; a row whose first target lies beyond that scores none.
    rows = [r for r in rows if r[2] <= block]
    rows.sort(key=lambda r: min(len(r[1]), block))
    start = 0
    while start < len(rows):
        end = start + 1
        while end < len(rows) and (end + 1 - start) * min(len(rows[end][1]), block) <= max_tokens:
            end += 1
        batch = rows[start:end]
        T = min(max(len(r[1]) for r in batch), block)  # positions read
        idx = torch.zeros(len(batch), T, dtype=torch.long)
        tgt = torch.full((len(batch), T), -1, dtype=torch.long)  # tgt[:, j-1] = token j
        for b, (_, ids, _, _) in enumerate(batch):
            n, m = min(len(ids), T), min(len(ids) - 1, T)
            idx[b, :n] = torch.tensor(ids[:n])
            tgt[b, :m] = torch.tensor(ids[1:m + 1])
        hit = (model(idx.to(device)).argmax(-1).cpu() == tgt).numpy()  # (b, T): hit[:, j-1] scores token j
        for b, (i, ids, first, offset) in enumerate(batch):
            last = min(len(ids), T + 1)  # tokens [first, last) are scored
            hits[i][offset:offset + last - first] = hit[b, first - 1:last - 1]
        start = end
    return hits


def per_token_counts(model, vocab: Vocab, view: str, executions: Sequence[Execution],
                     max_tokens: int = 16384) -> list[tuple[int, int]]:
    """Teacher-forced (correct, eligible) per expression for `view` (`per_token_hits` summed)."""
    return [(int(h.sum()), len(h)) for h in per_token_hits(model, vocab, view, executions, max_tokens)]


# The fields of every result dict (plus tf_correct/tf_total with per-token counts, trace when
# asked for, and the data file's own columns such as a pool's id).
RESULT_FIELDS = ("expr", "root", "value", "prediction", "correct", "valid", "reason", "trace_len", "max_depth",
                 "n_frames", "max_frame_width", "generated", "pred_trace_len", "pred_max_depth", "pred_n_frames",
                 "fed", "trace_exact", "diverge_at")


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
            "trace_len": ex.trace_len, "max_depth": ex.max_depth, "n_frames": ex.n_frames,
            "max_frame_width": ex.max_frame_width,
            "generated": g.n_generated, "pred_trace_len": len(produced), "pred_max_depth": g.max_depth,
            "pred_n_frames": g.n_frames, "fed": g.fed, "trace_exact": exact, "diverge_at": diverge,
        }
        if per_token is not None:
            r["tf_correct"], r["tf_total"] = per_token[k]
        if traces is True or (traces == "inexact" and not exact):
            r["trace"] = " ".join(produced)
        if extra is not None:
            r.update(extra[k])
        out.append(r)
    return out


def accuracy(results: Sequence[dict]) -> dict:
    return share(sum(bool(r["correct"]) for r in results), len(results))


def share(k: int, n: int) -> dict:
    """k of n with its 95% Wilson interval, as `accuracy()` reports it."""
    lo, hi = wilson(k, n)
    return {"n": n, "correct": k, "accuracy": k / n if n else 0.0, "ci95": [lo, hi]}


def summarize(results: Sequence[dict], n_boot: int = 2000) -> dict:
    """Headline numbers of a results list (all recomputable from the list alone)."""
    s = accuracy(results)
    n = len(results)
    s["valid"] = sum(bool(r["valid"]) for r in results) / n if n else 0.0
    s["trace_exact"] = sum(bool(r["trace_exact"]) for r in results) / n if n else 0.0
    s["generated_tokens"] = sum(r["generated"] for r in results)
    if n and "tf_total" in results[0]:
        c = [r["tf_correct"] for r in results]
        t = [r["tf_total"] for r in results]
        s["per_token"] = sum(c) / sum(t) if sum(t) else 0.0
        s["per_token_ci95"] = list(bootstrap_ratio(c, t, n_boot))
        s["per_token_positions"] = sum(t)
    s["invalid_reasons"] = dict(Counter(r["reason"] for r in results if not r["valid"]).most_common())
    return s


def group_accuracy(results: Sequence[dict], key: str | Callable[[dict], object]) -> list[dict]:
    """Final-answer accuracy with Wilson intervals per group; `key` a result field or a function.
    Groups come out sorted by key."""
    fn = key if callable(key) else (lambda r: r[key])
    groups: dict[object, list[dict]] = {}
    for r in results:
        groups.setdefault(fn(r), []).append(r)
    return [{"group": g, **accuracy(rs)} for g, rs in sorted(groups.items(), key=lambda kv: _sort_key(kv[0]))]


def _sort_key(v):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def write_results(out_dir: str | Path, results: Sequence[dict], summary: dict) -> tuple[Path, Path]:
    """results.jsonl (one expression per line) and summary.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res, summ = out / "results.jsonl", out / "summary.json"
    with open(res, "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    summ.write_text(json.dumps(summary, indent=2) + "\n")
    return res, summ


def read_results(path: str | Path) -> list[dict]:
    path = Path(path)
    if path.is_dir():
        path = path / "results.jsonl"
    try:
        with open(path) as f:
            results = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not a results file ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a results file (not text)") from None
    for i, r in enumerate(results, 1):
        if not (isinstance(r, dict) and isinstance(r.get("expr"), str) and isinstance(r.get("correct"), bool)):
            raise DataError(f"{path}: record {i} is not a per-expression result (needs 'expr' and 'correct')")
    return results


def read_expressions(path: str | Path, limit: int | None = None) -> tuple[list[Call], list[dict]]:
    """Expressions to evaluate: a parquet file with an `expr` column (a pool: its `id` column is
    kept with each result) or a text file with one written expression per line (blank lines
    and lines starting with # are skipped). Returns (parsed calls, per-expression extras)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if path.suffix == ".parquet":
        table = read_pool(path)
        if limit is not None:
            table = table.slice(0, limit)
        texts = table.column("expr").to_pylist()
        ids = table.column("id").to_pylist() if "id" in table.column_names else None
        where = [f"row {i}" for i in range(len(texts))]
    else:
        try:
            lines = path.read_text().splitlines()
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
            e = parse(text)
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
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path).slice(0, n)
    plain = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_string,
             pa.types.is_large_string)
    keep = [c for c in table.column_names if c != "expr" and any(t(table.schema.field(c).type) for t in plain)]
    cols = {c: table.column(c).to_pylist() for c in keep}
    return [{c: cols[c][i] for c in keep} for i in range(n)]


def read_grouped(path: str | Path, limit: int | None, by: Sequence[str] | None, default_by: Sequence[str],
                 per_group: int | None = None) -> tuple[list[Call], list[dict], list[str]]:
    """Expressions with their data columns, for a command that groups its figures by columns:
    `by` (default: those of `default_by` the data has) is checked against the data, and with
    `per_group` only the first that many expressions of each group of the first column are kept.
    Returns (expressions, their columns, the grouping columns)."""
    exprs, _ = read_expressions(path, limit)
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


def evaluate(predictor, view: str, exprs: Sequence[Call], vocab: Vocab, limits: Limits | None = None,
             batch_size: int = 64, model=None, extra: Sequence[dict] | None = None, traces: bool | str = False,
             progress=None, n_boot: int = 2000) -> tuple[list[dict], dict]:
    """Greedy-decode `exprs` with `predictor` in `view` and score them; with `model`, add
    teacher-forced per-token accuracy. Returns (per-expression results in input order, summary)."""
    executions = [execute(e) for e in exprs]
    t0 = time.perf_counter()
    gens = generate(predictor, exprs, vocab, view, limits or Limits(), batch_size, progress)
    seconds = time.perf_counter() - t0
    tf = per_token_counts(model, vocab, view, executions) if model is not None else None
    results = expression_results(gens, executions, tf, extra, traces)
    summary = summarize(results, n_boot)
    summary.update(view=view, seconds=seconds, expr_per_s=len(exprs) / seconds if seconds else None,
                   tokens_per_s=summary["generated_tokens"] / seconds if seconds else None)
    return results, summary


def answer_accuracy_fn(exprs: Sequence[Call | str], batch_size: int = 64, limits: Limits | None = None):
    """A `validate_fn` for `rlmlab.train`: greedy final-answer accuracy on `exprs` ("answer_acc",
    the metric "auto" checkpoint selection picks) and the share of valid traces ("answer_valid").
    By default a row may generate twice the set's longest canonical trace, so that an untrained
    model's runaway rows do not make early validations slow."""
    stats = [trace_stats(e if isinstance(e, Call) else parse(e)) for e in exprs]
    values = [value_token(s.value) for s in stats]
    limits = limits or Limits(max_new_tokens=2 * max(s.trace_len for s in stats))

    def validate(model, vocab: Vocab, view: str) -> dict:
        gens = generate(ModelPredictor(model), exprs, vocab, view, limits, batch_size)
        right = sum(g.valid and g.answer == v for g, v in zip(gens, values))
        return {"answer_acc": right / len(exprs), "answer_valid": sum(g.valid for g in gens) / len(exprs)}

    return validate

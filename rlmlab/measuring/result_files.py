"""Per-expression result files, as `rlmlab eval`, `rlmlab probe` and `rlmlab run` write them:
`results.parquet` (one row per expression), `traces.parquet` (the produced traces kept, by
row, so that a table of answers never reads them) and `summary.json`. Folders written before
Parquet hold `results.jsonl` (one JSON object per expression, traces inline) and read the same.
No model code: reports read them. The columns are documented in docs/results-format.md.

A run's evaluation on a set lies in `<run>/eval/<set>/`; the set named "eval" (the threshold
experiments' binned set, from their eval.parquet) in `<run>/eval/` itself (`eval_dir`). Runs
written before kept that one in `<run>/eval/eval/`, which `find_eval_dir` and `evaluated_sets`
still read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.records import read_records, write_records
from rlmlab.safeio import first_file, read_jsonl, shorten

EVAL = "eval"
RESULTS = "results.parquet"
TRACES = "traces.parquet"
LEGACY_RESULTS = "results.jsonl"
TRACE_FIELD = "trace"
ROW_FIELD = "row"


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _flag(v) -> bool:
    return isinstance(v, bool)


def _text(v) -> bool:
    return isinstance(v, str)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# The fields of a per-expression record that reports and pages compute with, and what each must
# hold where a record has it (None too where marked): a string `correct` is truthy, a negative
# divergence indexes from the end, a NaN ratio falls in no bin.
FIELDS = {"expr": (_text, "text"), "correct": (_flag, "true or false"), "valid": (_flag, "true or false"),
          "trace_exact": (_flag, "true or false"), "ood": (_flag, "true or false"),
          "within_tmax": (_flag, "true or false"), "bin": (_text, "text"), "reason": (_text, "text or null"),
          "diverge_at": (_count, "a count or null"), "trace_len": (_count, "a count"),
          "positions": (_count, "a count"), "position_differ": (_count, "a count"),
          "ratio": (_finite, "a finite number")}
NULLABLE = frozenset({"reason", "diverge_at"})


def write_results(out_dir: str | Path, results: Sequence[dict], summary: dict, indent: int = 2) -> tuple[Path, Path]:
    """results.parquet, traces.parquet (when any record carries a trace) and summary.json;
    returns the paths of the first and the last. A legacy results.jsonl there is replaced."""
    out = Path(out_dir)
    res = write_rows(out, results)
    summ = out / "summary.json"
    summ.write_text(json.dumps(summary, indent=indent) + "\n")
    return res, summ


def write_rows(out: Path, results: Sequence[dict]) -> Path:
    """results.parquet and traces.parquet of `results` in folder `out`; returns the first."""
    out.mkdir(parents=True, exist_ok=True)
    rows, traces = split_traces(results)
    res = write_records(out / RESULTS, rows)
    if traces:
        write_records(out / TRACES, traces)
    elif (out / TRACES).exists():
        (out / TRACES).unlink()
    if (out / LEGACY_RESULTS).exists():
        (out / LEGACY_RESULTS).unlink()
    return res


def split_traces(results: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(the rows of results.parquet, the rows of traces.parquet) that hold `results`."""
    rows = [{k: v for k, v in r.items() if k != TRACE_FIELD} for r in results]
    traces = [{ROW_FIELD: i, TRACE_FIELD: r[TRACE_FIELD]} for i, r in enumerate(results) if TRACE_FIELD in r]
    return rows, traces


def results_file(folder: str | Path) -> Path | None:
    """The per-expression file of a result folder (Parquet, else legacy JSON lines), or None."""
    return first_file(folder, (RESULTS, LEGACY_RESULTS))


def has_results(folder: str | Path) -> bool:
    return results_file(folder) is not None


def eval_dir(run_dir: str | Path, set_name: str) -> Path:
    """Where a run's evaluation on the set `set_name` is written."""
    run_dir = Path(run_dir)
    return run_dir / EVAL if set_name == EVAL else run_dir / EVAL / set_name


def find_eval_dir(run_dir: str | Path, set_name: str) -> Path:
    """Where a run's evaluation on `set_name` is read: `eval_dir`, else the folder that runs
    written before it used (`<run>/eval/eval/` for the set "eval")."""
    new, old = eval_dir(run_dir, set_name), Path(run_dir) / EVAL / set_name
    return old if not has_results(new) and has_results(old) else new


def run_of_eval_dir(folder: str | Path) -> Path:
    """The run folder an evaluation folder of either layout belongs to."""
    folder = Path(folder)
    return folder.parent.parent if folder.parent.name == EVAL else folder.parent


def evaluated_sets(run_dir: str | Path) -> dict[str, Path]:
    """Every set a run was evaluated on, {set: folder}, by name, from either layout (the
    current one where a run holds both)."""
    top = Path(run_dir) / EVAL
    found = {p.name: p for p in top.glob("*") if p.is_dir() and has_results(p)}
    if has_results(top):
        found[EVAL] = top
    return dict(sorted(found.items()))


def summary_learner(summary) -> str | None:
    """The learner a summary.json names ("cot", "rm", "cot@rope"), or None: "learner", or in
    summaries written before the rename "view" (beside which "learner", where present, named the
    learner with its encoding)."""
    who = summary.get("learner", summary.get("view")) if isinstance(summary, dict) else None
    return who if isinstance(who, str) else None


def read_results(path: str | Path, required: tuple[str, ...] = ("expr", "correct"),
                 traces: bool = True) -> list[dict]:
    """The records of a result folder (or of its results.parquet or results.jsonl), each checked
    for the fields `required` (a probe's per-expression rows have no `correct`). With `traces`
    the kept traces come back in their records' `trace` field, as in a legacy file."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    file = results_file(path) if path.is_dir() else path
    if file is None:
        raise DataError(f"{path}: no {RESULTS} or {LEGACY_RESULTS} there")
    if file.suffix == ".jsonl":
        results = read_jsonl(file, DataError, "results file")
    else:
        results = read_records(file)
        if traces and (folder / TRACES).exists():
            _attach_traces(results, folder / TRACES)
    if not results:
        raise DataError(f"{file}: no records (an evaluation or a probe writes one per expression)")
    for i, r in enumerate(results, 1):
        if not (isinstance(r, dict) and all(k in r for k in required)):
            raise DataError(f"{file}: record {i} is not a per-expression result (needs "
                            + " and ".join(f"'{k}'" for k in required) + ")")
        check_fields(r, f"{file}: record {i}")
    if not traces:
        for r in results:
            r.pop(TRACE_FIELD, None)
    return results


def check_fields(record: dict, where: str) -> None:
    """Refuse a record whose field of `FIELDS` holds what that field never holds."""
    for key, (ok, what) in FIELDS.items():
        if key in record and not (ok(v := record[key]) or (v is None and key in NULLABLE)):
            raise DataError(f"{where}: '{key}' should be {what}, got {shorten(repr(v))}")


def require_fields(results: list[dict], fields: tuple[str, ...], where: str) -> None:
    """Refuse results that lack a field a table is computed from, naming it: without it a cell
    would be blank or a diagnostic missing, without a word why."""
    for key in fields:
        if any(key not in r for r in results):
            raise DataError(f"{where}: the results have no '{key}' field, which this report needs")


def _attach_traces(results: list[dict], path: Path) -> None:
    for t in read_records(path):
        row, trace = t.get(ROW_FIELD), t.get(TRACE_FIELD)
        if not (isinstance(row, int) and not isinstance(row, bool) and 0 <= row < len(results)
                and isinstance(trace, str) and TRACE_FIELD not in results[row]):
            raise DataError(f"{path}: a trace row does not name one result of {len(results)}")
        results[row][TRACE_FIELD] = trace


def attach_traces(results: list[dict], path: Path) -> None:
    """Put the traces of traces.parquet file `path` back into `results`, the rows of its
    results.parquet (a file converted beside the ones it replaces is read back this way)."""
    _attach_traces(results, path)

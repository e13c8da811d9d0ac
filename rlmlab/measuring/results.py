"""Per-expression result files: `results.jsonl` (one JSON object per expression) and
`summary.json`, as `rlmlab eval` and `rlmlab run` write them. No model code: reports read them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.safeio import read_jsonl


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


def summary_learner(summary) -> str | None:
    """The learner a summary.json names ("cot", "rm", "cot@rope"), or None: "learner", or in
    summaries written before the rename "view" (beside which "learner", where present, named the
    learner with its encoding)."""
    who = summary.get("learner", summary.get("view")) if isinstance(summary, dict) else None
    return who if isinstance(who, str) else None


def read_results(path: str | Path, required: tuple[str, ...] = ("expr", "correct")) -> list[dict]:
    """The records of a results.jsonl (or of a folder holding one), each checked for the fields
    `required` (a probe's per-expression rows have no `correct`)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.jsonl"
    results = read_jsonl(path, DataError, "results file")
    types = {"expr": str, "correct": bool}
    for i, r in enumerate(results, 1):
        if not (isinstance(r, dict) and all(isinstance(r.get(k), types.get(k, object)) and k in r for k in required)):
            raise DataError(f"{path}: record {i} is not a per-expression result (needs "
                            + " and ".join(f"'{k}'" for k in required) + ")")
    return results


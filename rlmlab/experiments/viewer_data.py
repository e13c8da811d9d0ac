"""What the viewer shows, as data: evaluation folders read and checked, each expression's
canonical trace re-executed and aligned with the produced one (the first divergence, the frame
stack there), and the compact rows a page embeds (`page_data`). `rlmlab.experiments.viewer`
renders them as HTML.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlmlab.errors import DataError, RlmlabError
from rlmlab.experiments.refs import experiment_runs
from rlmlab.learning.learner import get_learner
from rlmlab.measuring.result_files import RESULTS, evaluated_sets, read_results, results_file, summary_learner
from rlmlab.safeio import parse_json, read_json, regular_file
from rlmlab.task.frames import StackReplay
from rlmlab.task.taskfile import PAPER, load_task
from rlmlab.task.trace import Execution, execute
from rlmlab.task.vocab import Vocab

SUMMARY = "summary.json"

# Outcome categories a page filters on; an invalid trace's category names why it stopped.
EXACT = "exact trace"
RIGHT_INEXACT = "right answer, trace differs"
WRONG_VALID = "wrong answer on a valid trace"
INVALID = "invalid trace: "

# The columns of each embedded row, in order (the page's JSON lists them too).
COLUMNS = ("expr", "value", "prediction", "correct", "valid", "category", "bin", "id", "trace_len",
           "pred_trace_len", "prompt_len", "diverge_at", "gold", "produced", "stack", "top_m")

# Printable ASCII that needs no escaping in JSON or in an HTML script element: a coded trace
# costs one byte per token as long as the token table fits (the vocabulary has 59 tokens).
ALPHABET = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in "\"\\<>&'")

# The decoder writes a token id outside the vocabulary as "<id N>", a token with a space in it.
_PRODUCED_TOKEN = re.compile(r"<id \d+>|\S+")

_MAX_ECHO = 160  # characters of a user's value quoted in an error


@dataclass
class EvalSet:
    """An evaluation folder's per-expression results and summary."""

    folder: Path
    results: list[dict]
    summary: dict
    total: int  # expressions in the file (more than `results` under a limit)
    lines: list[int]  # the line of each result in the file, for errors


def _short(text: str) -> str:
    text = str(text)
    return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "..."


# --- reading ---------------------------------------------------------------------------------

def read_eval_set(folder: str | Path, limit: int | None = None) -> EvalSet:
    """The first `limit` (default all) results of an evaluation folder, each checked; `lines`
    numbers them by line of a legacy results.jsonl, by row (from 1) of a results.parquet."""
    folder = Path(folder)
    path = results_file(folder)
    if path is None:
        raise DataError(f"{folder}: no {RESULTS} (not an evaluation folder)")
    regular_file(path, DataError, "results file")
    results, lines, total = [], [], 0
    if path.name == RESULTS:
        rows = read_results(folder, required=())
        total = len(rows)
        for n, r in enumerate(rows[:limit], 1):
            results.append(_check_record(r, f"{path}: row {n}"))
            lines.append(n)
    else:
        try:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    total += 1
                    if limit is None or len(results) < limit:
                        results.append(_check_result(line, path, n))
                        lines.append(n)
        except UnicodeDecodeError:
            raise DataError(f"{path}: not a results file (not UTF-8 text)") from None
    if not results:
        raise DataError(f"{path}: no results")
    summary = {}
    if (folder / SUMMARY).exists():
        summary = read_json(folder / SUMMARY, DataError, SUMMARY)
        if not isinstance(summary, dict):
            raise DataError(f"{folder / SUMMARY}: not a summary (a JSON object)")
    return EvalSet(folder, results, summary, total, lines)


def _check_result(line: str, path: Path, n: int) -> dict:
    where = f"{path}: line {n}"
    try:
        r = parse_json(line, where)
    except DataError as e:
        raise DataError(f"{where}: not JSON ({_short(str(e).removeprefix(where + ': '))})") from None
    return _check_record(r, where)


def _check_record(r, where: str) -> dict:
    if not (isinstance(r, dict) and isinstance(r.get("expr"), str) and isinstance(r.get("correct"), bool)):
        raise DataError(f"{where}: not a per-expression result (needs 'expr' and 'correct')")
    kinds = {"trace": str, "diverge_at": int, "reason": str, "valid": bool, "trace_exact": bool}
    for key, kind in kinds.items():
        v = r.get(key)
        if v is not None and not _is(v, kind):
            raise DataError(f"{where}: '{key}' should be {kind.__name__}, got {_short(repr(v))}")
    return r


def _is(value, kind: type) -> bool:
    # bool is a subclass of int: `true` is no position, and 1 is no flag.
    return isinstance(value, bool) if kind is bool else isinstance(value, kind) and not isinstance(value, bool)


# --- one expression --------------------------------------------------------------------------

def produced_tokens(trace: str) -> list[str]:
    """A saved produced trace (space-joined tokens) split back into tokens."""
    return _PRODUCED_TOKEN.findall(trace)


def first_divergence(gold: Sequence[str], produced: Sequence[str]) -> int | None:
    """The first position where the two traces differ (one ending counts), None if equal."""
    for j, (a, b) in enumerate(zip(gold, produced)):
        if a != b:
            return j
    return None if len(gold) == len(produced) else min(len(gold), len(produced))


def frame_stack(tokens: Sequence[str], prompt_len: int, at: int) -> tuple[list[tuple[str, ...]], int]:
    """The frame stack after the legal prefix `tokens[:at]`, bottom (root) first, and the number
    of context tokens of the top frame (its boundary m): the top frame is what RM reads there."""
    replay = StackReplay(tokens[:min(at, prompt_len)])
    for t in tokens[prompt_len:at]:
        if replay.feed(t) == "error":
            raise ValueError(f"not a legal trace prefix: {replay.error}")
    return [tuple(f.tokens) for f in replay.stack], replay.stack[-1].seg_start


def category(result: dict) -> str:
    """The outcome a page filters on: exact, right answer on another trace, wrong answer on a
    valid trace, or invalid with its reason."""
    valid = result.get("valid", result["correct"])
    if result["correct"]:
        return EXACT if result.get("trace_exact", True) else RIGHT_INEXACT
    if valid:
        return WRONG_VALID
    return INVALID + (result.get("reason") or "unknown reason")


@dataclass
class ExpressionView:
    """What a page shows of one expression (tokens, not yet coded)."""

    gold: tuple[str, ...]
    prompt_len: int
    produced: list[str] | None  # None: not saved
    produced_saved: bool
    diverge_at: int | None
    stack: list[tuple[str, ...]] | None
    top_m: int | None


def expression_view(result: dict, execution: Execution, where: str = "") -> ExpressionView:
    """Align a result with its canonical trace. The divergence comes from the produced trace when
    it was saved; otherwise from the recorded `diverge_at` (an exact trace is the canonical one)."""
    gold = execution.tokens
    saved = isinstance(result.get("trace"), str)
    if saved:
        produced = produced_tokens(result["trace"])
    elif result.get("trace_exact"):
        produced = list(gold)
    else:
        produced = None
    if produced is not None:
        d = first_divergence(gold, produced)
    else:
        d = result.get("diverge_at")
        if d is not None and not 0 <= d <= len(gold):
            raise DataError(f"{where}diverge_at {d} lies outside its canonical trace of {len(gold)} tokens")
    stack = top_m = None
    if d is not None:
        stack, top_m = frame_stack(gold, execution.prompt_len, d)
    return ExpressionView(gold, execution.prompt_len, produced, saved, d, stack, top_m)


# --- the rows of an evaluation page ----------------------------------------------------------

class _TokenTable:
    """Tokens to small integers (the vocabulary first, then anything else a trace holds), coded
    as fixed-width strings over ALPHABET once the table is complete."""

    def __init__(self, vocab: Vocab):
        self.tokens = list(vocab.tokens)
        self.index = {t: i for i, t in enumerate(self.tokens)}

    def ids(self, tokens: Sequence[str]) -> list[int]:
        index = self.index
        try:
            return [index[t] for t in tokens]
        except KeyError:  # a token outside the table (an out-of-vocabulary id): add it
            pass
        out = []
        for t in tokens:
            i = index.get(t)
            if i is None:
                i = index[t] = len(self.tokens)
                self.tokens.append(t)
            out.append(i)
        return out

    @property
    def width(self) -> int:
        w = 1
        while len(ALPHABET) ** w < len(self.tokens):
            w += 1
        return w

    def coder(self):
        w, base = self.width, len(ALPHABET)
        if w == 1:
            table = str.maketrans({i: c for i, c in enumerate(ALPHABET)})
            return lambda ids: "".join(map(chr, ids)).translate(table)

        def code(ids):
            out = []
            for i in ids:
                digits = []
                for _ in range(w):
                    i, r = divmod(i, base)
                    digits.append(ALPHABET[r])
                out.append("".join(reversed(digits)))
            return "".join(out)

        return code


def _bins(results: Sequence[dict]) -> list[str]:
    """Bin labels in the order of `bin_index` when the results have it, else as they come."""
    first: dict[str, tuple] = {}
    for k, r in enumerate(results):
        if r.get("bin") is not None:
            label = str(r["bin"])
            index = r.get("bin_index")
            first.setdefault(label, (0, index, k) if isinstance(index, (int, float)) else (1, 0, k))
    return sorted(first, key=first.get)


def page_data(es: EvalSet, executions: dict[str, Execution] | None = None, progress=None, task=None) -> dict:
    """The JSON a page embeds: the token table, bins, categories and one row per expression
    (`COLUMNS`; traces coded one `width` characters per token). `progress(1)` per expression.
    The expressions are `task`'s (default: the one the summary records)."""
    executions = {} if executions is None else executions
    task = load_task(task if task is not None else eval_set_task(es))
    table = _TokenTable(task.vocab)
    bins = _bins(es.results)
    bin_index = {b: i for i, b in enumerate(bins)}
    cats = [category(r) for r in es.results]
    fixed = [c for c in (EXACT, RIGHT_INEXACT, WRONG_VALID) if c in cats]
    categories = fixed + [c for c, _ in Counter(c for c in cats if c.startswith(INVALID)).most_common()]
    cat_index = {c: i for i, c in enumerate(categories)}
    raw = []
    src = results_file(es.folder)
    unit = "row" if src is not None and src.name == RESULTS else "line"
    for n, r in zip(es.lines, es.results):
        where = f"{src}: {unit} {n}: "
        ex = executions.get(r["expr"])
        if ex is None:
            try:
                ex = executions[r["expr"]] = execute(r["expr"], task.library)
            except RlmlabError as e:
                raise DataError(where + _short(e)) from None
        v = expression_view(r, ex, where)
        raw.append((r, v, table.ids(v.gold), None if not v.produced_saved else table.ids(v.produced),
                    None if v.stack is None else [table.ids(f) for f in v.stack]))
        if progress is not None:
            progress(1)
    code = table.coder()
    rows = []
    for (r, v, gold, produced, stack), cat in zip(raw, cats):
        row = {
            "expr": r["expr"], "value": r.get("value"), "prediction": r.get("prediction"),
            "correct": int(r["correct"]), "valid": int(bool(r.get("valid", r["correct"]))),
            "category": cat_index[cat], "bin": bin_index.get(str(r["bin"])) if r.get("bin") is not None else None,
            "id": r.get("id"), "trace_len": len(v.gold),
            "pred_trace_len": len(v.produced) if v.produced is not None else r.get("pred_trace_len"),
            "prompt_len": v.prompt_len, "diverge_at": v.diverge_at, "gold": code(gold),
            # A produced trace equal to the canonical one is not repeated: 1 stands for it.
            "produced": code(produced) if produced is not None else (1 if v.produced is not None else None),
            "stack": None if stack is None else [code(f) for f in stack], "top_m": v.top_m,
        }
        rows.append([row[c] for c in COLUMNS])
    return {"columns": list(COLUMNS), "alphabet": ALPHABET, "width": table.width, "tokens": table.tokens,
            "bins": bins, "categories": categories, "learner": summary_learner(es.summary) or "",
            "driver": _driver(summary_learner(es.summary) or ""), "rows": rows}


def _driver(name: str) -> str:
    """What the learner reads ("rm", "cot", ...), so that the page marks its side; "" if unknown."""
    try:
        return get_learner(name).driver
    except RlmlabError:
        return ""


# --- an experiment's evaluation sets ---------------------------------------------------------

def eval_set_task(es: EvalSet) -> str:
    """How to load the task an evaluation summary records (a paper summary records none)."""
    rec = es.summary.get("task") if isinstance(es.summary, dict) else None
    return rec.get("spec") if isinstance(rec, dict) and isinstance(rec.get("spec"), str) else PAPER


def eval_sets(folder: str | Path) -> list[tuple[str, str, str, Path]]:
    """(job, learner, set, evaluation folder) of every set evaluated (`evaluated_sets`) by a run
    that an experiment holds or refers to."""
    return [(job, learner, set_name, p) for job, learner, run in experiment_runs(Path(folder))
            for set_name, p in evaluated_sets(run).items()]


def read_experiment(folder: Path) -> dict:
    path = folder / "experiment.json"
    meta = read_json(path, DataError, "experiment.json")
    if not isinstance(meta, dict) or not isinstance(meta.get("kind"), str):
        raise DataError(f"{path}: not an experiment description (no 'kind')")
    return meta

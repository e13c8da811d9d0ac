"""Static HTML pages for reading what a model wrote: one page per evaluation set, an index per experiment.

An evaluation page (`eval_page`) shows every expression of an evaluation folder: its canonical
trace, re-executed here, aligned token by token with the trace the model produced, the first
divergence, and the frame stack at that point: the active frame RM reads next to the whole
prefix CoT reads. The rows are embedded as compact JSON (one character per token) and drawn by
the browser on demand, a filtered, paged list and one expression in detail, so a page of
thousands of expressions stays a few megabytes and opens at once. Results saved without the
produced traces (older folders) still show the canonical trace at the recorded divergence.

An experiment index (`experiment_index`) shows the report's tables and figures and links one
evaluation page per evaluated set of each run. Every page is self-contained: inline CSS,
JS and images, no network. What a page shows is gathered in `rlmlab.experiments.viewer_data`;
this module renders it.
"""

from __future__ import annotations

import base64
import html
import json
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.experiments.tables import learner_label
from rlmlab.experiments.viewer_assets import CSS, EVAL_JS
from rlmlab.experiments.viewer_data import (
    EvalSet,
    eval_sets,
    page_data,
    read_eval_set,
    read_experiment,
)
from rlmlab.measuring.result_files import RESULTS, results_file, run_of_eval_dir, summary_learner
from rlmlab.safeio import refuse_symlinks
from rlmlab.task.taskfile import PAPER, load_task
from rlmlab.task.trace import Execution


@dataclass
class Page:
    """A written page: where, how many expressions it shows, its size."""

    path: Path
    n: int
    bytes: int
    seconds: float
    sets: list[Page] = field(default_factory=list)  # an index's evaluation pages


# --- an evaluation page ----------------------------------------------------------------------

def _script_json(data: dict) -> str:
    # Inside <script> only "</" could end the element; escaping <, > and & covers it and any
    # token such as <call>, so no markup from the data ever reaches the HTML parser.
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def embedded_data(page: str) -> dict:
    """The JSON embedded in a page written by `eval_page` (for tests and scripts)."""
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    if m is None:
        raise DataError("not an evaluation page (no embedded data)")
    return json.loads(m.group(1))


def _link(rel: str) -> str:
    """A relative link to a file under the page's folder, its path percent-encoded."""
    return urllib.parse.quote(rel, safe="/")


def _esc(v) -> str:
    return html.escape(str(v), quote=True)


def _pct(x) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "–"


def _header(es: EvalSet, title: str, back: str | None) -> str:
    s, res = es.summary, es.results
    n = len(res)
    correct = sum(r["correct"] for r in res)
    parts = [f'<p class="back"><a href="{_esc(back)}">&larr; experiment index</a></p>' if back else "",
             f"<h1>{_esc(title)}</h1>"]
    who = []
    if summary_learner(s):
        who.append(f"learner <b>{_esc(learner_label(summary_learner(s)))}</b> (<code>{_esc(summary_learner(s))}</code>)")
    if s.get("predictor") == "oracle":
        who.append("oracle predictor")
    elif s.get("run_dir"):
        who.append(f"run <code>{_esc(s['run_dir'])}</code>")
    if s.get("step") is not None:
        who.append(f"checkpoint step {_esc(s['step'])}")
    if s.get("data"):
        who.append(f"data <code>{_esc(s['data'])}</code>")
    who.append(f"folder <code>{_esc(es.folder)}</code>")
    parts.append(f'<p class="meta">{" · ".join(who)}</p>')
    shown = f"{n:,} expressions" + (f" (the first {n:,} of {es.total:,})" if es.total > n else "")
    stats = [shown, f"final answer {_pct(correct / n)} ({correct:,}/{n:,})",
             f"valid traces {_pct(sum(bool(r.get('valid', r['correct'])) for r in res) / n)}",
             f"exact traces {_pct(sum(bool(r.get('trace_exact')) for r in res) / n)}"]
    if isinstance(s.get("per_token"), (int, float)) and es.total == n:
        stats.append(f"per-token (teacher-forced) {_pct(s['per_token'])}")
    parts.append(f'<p class="stats">{" · ".join(stats)}</p>')
    inexact = [r for r in res if not r.get("trace_exact")]
    saved = sum(isinstance(r.get("trace"), str) for r in inexact)
    if inexact and saved < len(inexact):
        run = Path(s.get("run_dir") or run_of_eval_dir(es.folder))
        cmd = f"rlmlab eval {run} --data {s.get('data', 'EXPRS')} --out {es.folder} --traces"
        # `rlmlab export` leaves checkpoints behind: say where the one to use lives.
        where = "" if (run / "best" / "checkpoint.json").exists() else (
            f" (<code>{_esc(run)}</code> holds no checkpoint: give the run folder this one was exported from, "
            "or retrain it with the command in the experiment's commands.jsonl)")
        parts.append(f'<p class="note">The produced trace was saved for {saved:,} of the {len(inexact):,} '
                     "expressions whose trace is not exact; for the others the page shows the canonical "
                     "trace, the recorded divergence and the frames there. To see what the model wrote, "
                     f"re-run the evaluation with the run's checkpoint: <code>{_esc(cmd)}</code>{where}.</p>")
    return "\n".join(p for p in parts if p)


_EVAL_BODY = """
<div id="bins"></div>
<div id="main">
<section id="left">
<div class="filters">
<select id="f-bin" title="bin"></select>
<select id="f-correct" title="correctness"><option value="">right and wrong</option>
<option value="wrong">wrong answers</option><option value="correct">right answers</option></select>
<select id="f-cat" title="outcome"></select>
<input id="f-text" type="search" placeholder="expression contains…">
</div>
<div class="pager"><button id="prev">&lsaquo; prev</button> <span id="range"></span>
<button id="next">next &rsaquo;</button></div>
<table class="list"><thead><tr><th>#</th><th>bin</th><th></th><th>outcome</th><th>len</th><th>div.</th>
<th>expression</th></tr></thead><tbody id="list-body"></tbody></table>
</section>
<section id="detail"><p class="hint">Pick an expression on the left (&uarr;/&darr; or j/k move).</p></section>
</div>
<noscript><p>This page draws its expressions with JavaScript.</p></noscript>
"""


def eval_page(es: EvalSet, title: str, back: str | None = None,
              executions: dict[str, Execution] | None = None, stage=None, task=None) -> str:
    """A self-contained HTML page of one evaluation set; `stage(name, total, unit)` opens a
    progress report (see `rlmlab.cli.progress`)."""
    data = page_data(es, executions, stage and stage(f"view {title}", len(es.results), "expr"), task)
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{_esc(title)}</title><style>{CSS}</style></head><body>\n<header>",
        _header(es, title, back), "</header>", _EVAL_BODY,
        f'<script type="application/json" id="data">{_script_json(data)}</script>\n',
        f"<script>{EVAL_JS}</script>\n</body></html>\n"])


# --- an experiment index ---------------------------------------------------------------------

def markdown_to_html(text: str) -> str:
    """The Markdown the report writes: pipe tables, bullet lists, headings and paragraphs, with
    `code` and **bold** inline; everything else is escaped text."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line:
            i += 1
        elif line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                block.append(_cells(lines[i]))
                i += 1
            out.append(_table(block))
        elif line.startswith(("- ", "* ")):
            items = []
            while i < len(lines) and lines[i].strip().startswith(("- ", "* ")):
                items.append(f"<li>{_inline(lines[i].strip()[2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
        elif line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 2, 6)
            out.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
            i += 1
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].strip().startswith(("|", "- ", "* ", "#")):
                para.append(lines[i].strip())
                i += 1
            out.append(f"<p>{_inline(' '.join(para))}</p>")
    return "\n".join(out)


def _cells(line: str) -> list[str]:
    s = line.strip()
    s = s[1:] if s.startswith("|") else s
    s = s[:-1] if s.endswith("|") else s
    return [c.strip() for c in s.split("|")]


def _table(rows: list[list[str]]) -> str:
    head, body = rows[0], rows[1:]
    if body and all(re.fullmatch(r":?-+:?", c) for c in body[0]):
        body = body[1:]
    th = "".join(f"<th>{_inline(c)}</th>" for c in head)
    trs = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
    return f'<table class="report"><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>'


def _inline(text: str) -> str:
    s = html.escape(text, quote=False)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)


def experiment_index(folder: str | Path, out: str | Path, limit: int | None = None, stage=None) -> Page:
    """Write `out/index.html` (the report's tables and figures, a table of evaluation sets) and
    one page per evaluation set at `out/<job>/<learner>/<set>.html`."""
    t0 = time.perf_counter()
    folder, out = Path(folder), Path(out)
    meta = read_experiment(folder)
    preset = meta.get("preset")
    # a folder from before tasks were recorded holds the paper's
    task = load_task(preset.get("task") if isinstance(preset, dict) and isinstance(preset.get("task"), str) else PAPER)
    executions: dict[str, Execution] = {}  # the learners of a job share their expressions
    pages, rows = [], []
    for job, name, set_name, set_dir in eval_sets(folder):
        rel = Path(job) / name / f"{set_name}.html"
        es = read_eval_set(set_dir, limit)
        title = f"{job} · {learner_label(name)} · {set_name}"
        page = write_page(out / rel, lambda: eval_page(es, title, "../../index.html", executions, stage, task),
                          len(es.results))
        pages.append(page)
        n = len(es.results)
        rows.append((job, learner_label(name), set_name, rel.as_posix(), n,
                     sum(r["correct"] for r in es.results) / n,
                     sum(bool(r.get("valid", r["correct"])) for r in es.results) / n,
                     sum(bool(r.get("trace_exact")) for r in es.results) / n))
    index = write_page(out / "index.html", lambda: _index_html(folder, meta, rows, limit), 0)
    index.sets, index.seconds = pages, time.perf_counter() - t0
    return index


def _index_html(folder: Path, meta: dict, rows: list[tuple], limit: int | None) -> str:
    title = f"{folder.resolve().name}: {meta['kind']} experiment"
    parts = [f"<h1>{_esc(title)}</h1>", f'<p class="meta">folder <code>{_esc(folder)}</code></p>',
             "<h2>Evaluation sets</h2>"]
    if rows:
        note = f" (the first {limit:,} expressions of each)" if limit else ""
        parts.append(f"<p>One page per learner and set{note}: every expression's trace against the "
                     "canonical one, where it first diverges and what each learner read there.</p>")
        # Folder names become relative links, percent-encoded: a job folder named
        # `javascript:alert(7)` must stay a path, never become a URL scheme.
        trs = "".join(f'<tr><td>{_esc(j)}</td><td>{_esc(lrn)}</td><td><a href="{_esc(_link(href))}">{_esc(s)}</a></td>'
                      f"<td>{n:,}</td><td>{_pct(acc)}</td><td>{_pct(valid)}</td><td>{_pct(exact)}</td></tr>"
                      for j, lrn, s, href, n, acc, valid, exact in rows)
        parts.append('<table class="report"><thead><tr><th>run</th><th>learner</th><th>set</th><th>expressions</th>'
                     f"<th>final answer</th><th>valid traces</th><th>exact traces</th></tr></thead><tbody>{trs}"
                     "</tbody></table>")
    else:
        parts.append("<p>No evaluation sets yet (<code>&lt;run&gt;/&lt;learner&gt;/eval/&lt;set&gt;/results.parquet"
                     "</code>).</p>")
    report = folder / "report"
    tables = sorted(report.glob("table-*.md"))
    figures = sorted(report.glob("*.png"))
    if tables:
        parts.append("<h2>Tables</h2>")
        for md in tables:
            try:
                text = md.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{md}: not UTF-8 text") from None
            parts.append(f'<h3>{_esc(md.stem)}</h3>\n<div class="md">{markdown_to_html(text)}</div>')
    if figures:
        parts.append("<h2>Figures</h2>")
        for png in figures:
            b64 = base64.b64encode(png.read_bytes()).decode("ascii")
            parts.append(f'<figure><img alt="{_esc(png.stem)}" src="data:image/png;base64,{b64}">'
                         f"<figcaption>{_esc(png.name)}</figcaption></figure>")
    if not tables and not figures:
        parts.append(f"<p>No report yet: <code>rlmlab report {_esc(folder)}</code> writes its tables and "
                     "figures.</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(title)}</title><style>{CSS}</style></head><body class=\"index\">\n"
            + "\n".join(parts) + "\n</body></html>\n")


# --- entry point -----------------------------------------------------------------------------

def write_page(path: Path, render, n: int) -> Page:
    t0 = time.perf_counter()
    text = render()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return Page(path, n, path.stat().st_size, time.perf_counter() - t0)


def build_view(path: str | Path, out: str | Path | None = None, limit: int | None = None, stage=None) -> Page:
    """Pages for an evaluation folder (`out/index.html`) or an experiment folder (an index and a
    page per evaluation set); `out` defaults to `path/view`."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such folder")
    if not path.is_dir():
        raise DataError(f"{path}: not a folder (give an evaluation folder or an experiment folder)")
    out = Path(out) if out is not None else path / "view"
    refuse_symlinks(out, "view folder")
    if results_file(path) is not None:
        es = read_eval_set(path, limit)
        return write_page(out / "index.html", lambda: eval_page(es, str(path), stage=stage), len(es.results))
    if (path / "experiment.json").exists():
        return experiment_index(path, out, limit, stage)
    raise DataError(f"{path}: neither an evaluation folder ({RESULTS}, from `rlmlab eval` or `rlmlab run`) "
                    "nor an experiment folder (experiment.json)")

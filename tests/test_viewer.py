"""`rlmlab view`: the embedded rows against the executor and the active-frame map, the filters'
categories, HTML escaping, the experiment index, results without traces, one-line errors; and
the produced traces that `rlmlab eval` and `rlmlab run` now keep for inexact expressions."""

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import sample_expressions

from rlmlab.cli import main
from rlmlab.experiments.viewer import embedded_data
from rlmlab.experiments.viewer_data import WRONG_VALID, produced_tokens
from rlmlab.learning.checkpoint import save_checkpoint
from rlmlab.learning.model import Transformer, preset
from rlmlab.measuring.result_files import read_results, write_rows
from rlmlab.task.expr import to_text
from rlmlab.task.frames import StackReplay, active_frame
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COMMITTED = Path(__file__).resolve().parents[1] / "results/length-197-small/length-197/cot/eval/eval"


def decoded_rows(data: dict) -> list[dict]:
    """The page's rows as dicts, traces and frames decoded back to tokens (independently of the
    page's own script)."""
    digit = {c: i for i, c in enumerate(data["alphabet"])}
    w, base = data["width"], len(data["alphabet"])

    def decode(s):
        out = []
        for i in range(0, len(s), w):
            v = 0
            for c in s[i:i + w]:
                v = v * base + digit[c]
            out.append(data["tokens"][v])
        return out

    rows = []
    for raw in data["rows"]:
        r = dict(zip(data["columns"], raw))
        r["gold"] = decode(r["gold"])
        r["produced"] = None if r["produced"] is None else r["gold"] if r["produced"] == 1 else decode(r["produced"])
        r["stack"] = None if r["stack"] is None else [decode(f) for f in r["stack"]]
        rows.append(r)
    return rows


def first_difference(a, b):
    for j in range(max(len(a), len(b))):
        if j >= len(a) or j >= len(b) or a[j] != b[j]:
            return j
    return None


def as_produced(row: dict, produced: list[str]) -> dict:
    """`row` as if the model had written `produced`: validity, reason and answer from a replay of
    it, as the decoder would record them (it stops at the first illegal token)."""
    ex = PAPER.execute(row["expr"])
    replay = StackReplay(produced[:ex.prompt_len])
    for t in produced[ex.prompt_len:]:
        if replay.feed(t) == "error":
            break
    valid = replay.done and replay.error is None
    answer = " ".join(replay.answer) if replay.answer else None
    exact = tuple(produced) == ex.tokens
    return {**row, "trace": " ".join(produced), "valid": valid, "prediction": answer,
            "reason": None if valid else replay.error or "the root never returned",
            "correct": valid and answer == ex.value_token, "trace_exact": exact,
            "diverge_at": None if exact else first_difference(ex.tokens, produced), "pred_trace_len": len(produced)}


def write_eval(folder: Path, rows: list[dict], summary: dict, form: str = "jsonl") -> Path:
    """An evaluation folder of `rows`: as `rlmlab eval` writes it now (form "parquet":
    results.parquet + traces.parquet) or as it wrote it before (form "jsonl": results.jsonl)."""
    folder.mkdir(parents=True, exist_ok=True)
    if form == "parquet":
        write_rows(folder, rows)
    else:
        (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.fixture(scope="module")
def oracle_eval(tmp_path_factory):
    """An oracle evaluation (`rlmlab eval --oracle rm --traces`) of 30 expressions, with
    bins, and four rows corrupted into the failures a model makes."""
    tmp = tmp_path_factory.mktemp("viewer")
    exprs = sorted(sample_expressions(60, 5), key=lambda e: -PAPER.execute(e).max_depth)[:30]
    data = tmp / "exprs.txt"
    data.write_text("\n".join(to_text(e) for e in exprs) + "\n")
    out = tmp / "oracle"
    assert main(["eval", "--oracle", "rm", "--data", str(data), "--out", str(out), "--quiet",
                 "--traces"]) == 0
    rows = read_results(out)
    assert all(r["trace_exact"] and "trace" in r for r in rows)
    for i, r in enumerate(rows):  # bins listed out of order: the page orders them by bin_index
        r["bin"], r["bin_index"] = ("deep", 1) if i % 2 == 0 else ("shallow", 0)
    # A number-valued expression first: its last returned digit is the answer.
    first = next(i for i, r in enumerate(rows) if r["value"].isdigit())
    rows[0], rows[first] = rows[first], rows[0]
    golds = [PAPER.execute(r["expr"]).tokens for r in rows]
    # 0: a wrong answer on a valid trace; 1: a digit changed two thirds in, deep in the stack;
    # 2: a stray </call> in the middle (invalid); 3: stopped early.
    g = list(golds[0])
    j = max(k for k in range(1, len(g) - 1) if (g[k - 1], g[k + 1]) == ("<return>", "</return>"))
    rows[0] = as_produced(rows[0], g[:j] + [str((int(g[j]) + 1) % 10)] + g[j + 1:])
    assert rows[0]["valid"] and not rows[0]["correct"]
    g = list(golds[1])
    j = next(k for k in range(2 * len(g) // 3, len(g)) if g[k].isdigit())
    rows[1] = as_produced(rows[1], g[:j] + [str((int(g[j]) + 3) % 10)] + g[j + 1:])
    g = list(golds[2])
    rows[2] = as_produced(rows[2], g[:len(g) // 2] + ["</call>"])
    g = list(golds[3])
    rows[3] = as_produced(rows[3], g[:len(g) - 3])
    summary = json.loads((out / "summary.json").read_text())
    summary["data"] = "exprs<script>alert(1)</script>.txt"  # markup in a field the header shows
    return write_eval(tmp / "run" / "eval" / "exprs", rows, summary, "parquet")


def build(argv, tmp_path) -> str:
    out = tmp_path / "view"
    assert main(["view", *argv, "--out", str(out)]) == 0
    return (out / "index.html").read_text()


def test_divergence_and_the_frames_there_match_the_executor_and_the_active_frame_map(oracle_eval, tmp_path):
    page = build([str(oracle_eval)], tmp_path)
    results = read_results(oracle_eval)
    rows = decoded_rows(embedded_data(page))
    assert len(rows) == len(results) == 30
    for r, res in zip(rows, results):
        ex = PAPER.execute(res["expr"])
        assert tuple(r["gold"]) == ex.tokens and r["prompt_len"] == ex.prompt_len and r["expr"] == res["expr"]
        assert r["produced"] == produced_tokens(res["trace"])
        assert r["diverge_at"] == first_difference(r["gold"], r["produced"]) == res["diverge_at"]
        if r["diverge_at"] is None:
            assert r["stack"] is None
            continue
        d = r["diverge_at"]
        assert r["stack"][-1] == active_frame(r["gold"][:d])  # what RM read there: Pi_rec(prefix)
        replay = StackReplay(ex.tokens[:ex.prompt_len])
        for t in ex.tokens[ex.prompt_len:d]:
            replay.feed(t)
        assert r["stack"] == [f.tokens for f in replay.stack] and r["top_m"] == replay.stack[-1].seg_start
    assert sum(r["diverge_at"] is not None for r in rows) == 4
    assert max(len(r["stack"]) for r in rows if r["stack"]) >= 2  # a divergence below the root frame


def test_filters_categories_and_bins(oracle_eval, tmp_path):
    page = build([str(oracle_eval)], tmp_path)
    data = embedded_data(page)
    cats = data["categories"]
    assert cats[0] == "exact trace" and WRONG_VALID in cats
    assert "invalid trace: </call> with no open <call>" in cats
    assert any(c.startswith("invalid trace: ") and "</call>" not in c for c in cats)  # the early stop
    assert data["bins"] == ["shallow", "deep"]  # by bin_index, not by first appearance
    rows = decoded_rows(data)
    assert [data["bins"][r["bin"]] for r in rows[:2]] == ["deep", "shallow"]
    assert cats[rows[2]["category"]] == "invalid trace: </call> with no open <call>"
    assert not rows[2]["correct"] and not rows[2]["valid"]
    for select_id in ("f-bin", "f-correct", "f-cat"):
        assert f'id="{select_id}"' in page
    assert data["learner"] == "rm"


def test_every_string_is_escaped(oracle_eval, tmp_path):
    page = build([str(oracle_eval)], tmp_path)
    for raw in ("<call>", "</call>", "<return>", "</return>", "<script>alert"):
        assert raw not in page
    assert "exprs&lt;script&gt;alert(1)&lt;/script&gt;.txt" in page
    assert "\\u003ccall\\u003e" in page and "<call>" in embedded_data(page)["tokens"]
    assert page.count("<script") == 2  # the data and the page's own script, nothing else


def test_the_same_rows_in_either_form_give_the_same_page(oracle_eval, tmp_path):
    rows, summary = read_results(oracle_eval), json.loads((oracle_eval / "summary.json").read_text())
    legacy = write_eval(tmp_path / "legacy" / "eval" / "exprs", rows, summary)
    assert not (legacy / "results.parquet").exists()
    assert embedded_data(build([str(legacy)], tmp_path / "a")) == embedded_data(build([str(oracle_eval)], tmp_path / "b"))


@pytest.mark.parametrize("form", ["jsonl", "parquet"])
def test_results_without_traces_still_render(oracle_eval, tmp_path, form):
    old = tmp_path / "old" / "eval" / "exprs"
    rows = read_results(oracle_eval)
    write_eval(old, [{k: v for k, v in r.items() if k != "trace"} for r in rows],
               json.loads((oracle_eval / "summary.json").read_text()), form)
    assert not (old / "traces.parquet").exists()
    page = build([str(old)], tmp_path)
    shown = decoded_rows(embedded_data(page))
    for r, res in zip(shown, rows):
        assert r["diverge_at"] == res["diverge_at"]
        assert r["produced"] == (r["gold"] if res["trace_exact"] else None)
        if r["diverge_at"] is not None:
            assert r["stack"][-1] == active_frame(r["gold"][:r["diverge_at"]])
    assert "--traces" in page and "saved for 0 of the 4" in page


def test_a_committed_results_folder_renders(tmp_path, capsys):
    page = build([str(COMMITTED), "--limit", "40"], tmp_path)
    assert "wrote" in capsys.readouterr().out
    rows = decoded_rows(embedded_data(page))
    results = read_results(COMMITTED)[:40]
    assert len(rows) == 40 and "(the first 40 of 3,100)" in page
    for r, res in zip(rows, results):
        assert r["diverge_at"] == res["diverge_at"] and r["trace_len"] == res["trace_len"]
        if res["diverge_at"] is not None:
            assert r["stack"][-1] == active_frame(r["gold"][:res["diverge_at"]])


def test_experiment_index_links_every_eval_set(oracle_eval, tmp_path):
    exp = tmp_path / "exp"
    sets = ["job-a/rm/eval/eval", "job-a/cot/eval/eval", "job-b/rm/eval/test"]
    for s in sets:
        shutil.copytree(oracle_eval, exp / s)
    shutil.copytree(oracle_eval, exp / "job-a" / "rm" / "superseded-step3" / "eval" / "eval")  # not a current set
    (exp / "experiment.json").write_text(json.dumps({"kind": "length", "threshold": 96}))
    (exp / "report").mkdir()
    (exp / "report" / "table-length-96.md").write_text(
        "| **Length** bin | <=0.25 | >5.0 |\n|---|---|---|\n| RM acc. (%) | 100.0 | 39.0 |\n\n"
        "Runs (`rlmlab frames`):\n\n- length-96 RM: 32.7 (300; 3 min)\n")
    (exp / "report" / "bins-length-96.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    out = tmp_path / "view"
    assert main(["view", str(exp), "--out", str(out), "--limit", "10"]) == 0
    index = (out / "index.html").read_text()
    links = re.findall(r'<a href="([^"]+\.html)">', index)
    assert sorted(links) == sorted(f"{s.split('/')[0]}/{s.split('/')[1]}/{s.split('/')[3]}.html" for s in sets)
    for link in links:
        page = (out / link).read_text()
        assert len(embedded_data(page)["rows"]) == 10 and 'href="../../index.html"' in page
    assert "<th><strong>Length</strong> bin</th><th>&lt;=0.25</th>" in index and "<td>39.0</td>" in index
    assert "<code>rlmlab frames</code>" in index and "<li>length-96 RM: 32.7 (300; 3 min)</li>" in index
    assert "data:image/png;base64," in index
    assert not (exp / "view").exists()  # with --out, nothing is written into the experiment folder


ROWS = [{"expr": "square(2)", "correct": False, "trace": "square ( 2 )"}]


def _damage(path: Path, how: str) -> Path:
    """`path` cut to half its bytes, or replaced by as many random bytes; returns its folder."""
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2] if how == "truncate" else random.Random(0).randbytes(len(raw)))
    return path.parent


def _foreign(path: Path) -> Path:
    """A Parquet file of the same name that rlmlab did not write (no records metadata)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"expr": ["square(2)"], "correct": [True]}), path)
    return path.parent


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "no such folder"),
    (lambda p: (p / "file.txt").write_text("x") and p / "file.txt", "not a folder"),
    (lambda p: p, "neither an evaluation folder"),
    (lambda p: write_eval(p / "e", [], {}), "no results"),
    (lambda p: (write_eval(p / "e", [], {}) / "results.jsonl").write_text('{"expr": "square(2)", "correct": true}\n'
                                                                          '\n{"expr": oops\n') and p / "e",
     "results.jsonl: line 3: not JSON"),
    (lambda p: write_eval(p / "e", [{"expr": "square(2)"}], {}), "line 1: not a per-expression result"),
    (lambda p: write_eval(p / "e", [{"expr": "square(2)", "correct": True, "trace": 3}], {}),
     "line 1: 'trace' should be str"),
    (lambda p: write_eval(p / "e", [{"expr": "square(2)", "correct": False, "diverge_at": True}], {}),
     "'diverge_at' should be int"),
    (lambda p: write_eval(p / "e", [{"expr": "square(2)", "correct": False, "diverge_at": 999}], {}),
     "line 1: diverge_at 999 lies outside"),
    (lambda p: write_eval(p / "e", [{"expr": "square(" * 10 + "x" * 2000, "correct": False}], {}), "line 1: "),
    (lambda p: (write_eval(p / "e", [{"expr": "square(2)", "correct": True}], {}) / "summary.json").write_text("[")
     and p / "e", "summary.json: not valid JSON"),
    (lambda p: (p / "experiment.json").write_text("{}") and p, "experiment.json: not an experiment description"),
    # The same in the Parquet form `rlmlab eval` writes now, and a damaged or foreign Parquet file.
    (lambda p: write_eval(p / "e", [], {}, "parquet"), "results.parquet: no records"),
    (lambda p: _damage(write_eval(p / "e", ROWS, {}, "parquet") / "results.parquet", "truncate"),
     "results.parquet: not a readable Parquet file"),
    (lambda p: _damage(write_eval(p / "e", ROWS, {}, "parquet") / "results.parquet", "random"),
     "results.parquet: not a readable Parquet file"),
    (lambda p: _damage(write_eval(p / "e", ROWS, {}, "parquet") / "traces.parquet", "truncate"),
     "traces.parquet: not a readable Parquet file"),
    (lambda p: _foreign(write_eval(p / "e", ROWS, {}, "parquet") / "results.parquet"),
     "results.parquet: not a table of records written by rlmlab"),
    (lambda p: write_eval(p / "e", [{"expr": "square(2)"}], {}, "parquet"), "row 1: not a per-expression result"),
    (lambda p: write_eval(p / "e", [{"expr": "square(2)", "correct": True, "trace": 3}], {}, "parquet"),
     "traces.parquet: a trace row does not name one result"),
    (lambda p: write_eval(p / "e", [{"expr": "square(2)", "correct": False, "diverge_at": True}], {}, "parquet"),
     "record 1: 'diverge_at' should be a count or null"),
    (lambda p: write_eval(p / "e", [{"expr": "square(2)", "correct": False, "diverge_at": 999}], {}, "parquet"),
     "row 1: diverge_at 999 lies outside"),
    (lambda p: write_eval(p / "e", [{"expr": "square(" * 10 + "x" * 2000, "correct": False}], {}, "parquet"),
     "row 1: "),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, make, message):
    """Legacy results.jsonl first, then the same faults in results.parquet + traces.parquet."""
    path = make(tmp_path)
    code = main(["view", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("rlmlab view: error: ") and err.count("\n") == 1 and message in err, err
    assert len(err) < 600  # a long malformed expression is not echoed whole


def test_limit_must_be_positive(oracle_eval, capsys):
    assert main(["view", str(oracle_eval), "--limit", "0"]) == 2
    assert "--limit must be at least 1" in capsys.readouterr().err


def test_produced_tokens_keep_out_of_vocabulary_ids_whole():
    assert produced_tokens("add ( 1 , <id 73> <call>") == ["add", "(", "1", ",", "<id 73>", "<call>"]


def test_the_viewer_does_not_import_torch():
    code = "import sys, rlmlab.experiments.viewer; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_eval_keeps_the_traces_that_are_not_exact(tmp_path):
    vocab = PAPER.vocab
    torch.manual_seed(0)
    run = tmp_path / "run"
    save_checkpoint(run, "best", Transformer(preset("tiny", "rm", len(vocab))).eval(), vocab=vocab, learner="rm",
                    config={}, step=1, metrics={})
    data = tmp_path / "exprs.txt"
    data.write_text("\n".join(to_text(e) for e in sample_expressions(8, 3)) + "\n")
    assert main(["eval", str(run), "--data", str(data), "--quiet", "--max-new-tokens", "30", "--no-per-token"]) == 0
    rows = read_results(run / "eval" / "exprs")
    assert rows and all(("trace" in r) != r["trace_exact"] for r in rows)  # an untrained model: all inexact
    assert all(len(produced_tokens(r["trace"])) == r["pred_trace_len"] for r in rows)
    page = build([str(run / "eval" / "exprs")], tmp_path)
    for r, res in zip(decoded_rows(embedded_data(page)), rows):
        assert r["produced"] == produced_tokens(res["trace"]) and r["diverge_at"] == res["diverge_at"]
    assert "re-run the evaluation" not in page  # every inexact trace is there
    # The oracle's traces are all exact: none is kept unless --traces asks for every one.
    for flags, kept in (([], 0), (["--traces"], 8)):
        out = tmp_path / f"oracle{len(flags)}"
        assert main(["eval", "--oracle", "cot", "--data", str(data), "--out", str(out), "--quiet",
                     *flags]) == 0
        assert sum("trace" in r for r in read_results(out)) == kept
        assert (out / "traces.parquet").exists() == (kept > 0) and not (out / "results.jsonl").exists()


def test_run_keeps_inexact_traces_and_the_experiment_views(tmp_path):
    out = tmp_path / "length"
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]) == 0
    eval_dir = out / "length-96" / "rm" / "eval"
    rows = read_results(eval_dir)
    assert any(not r["trace_exact"] for r in rows)  # three training steps: the model is mostly wrong
    for r in rows:
        assert ("trace" in r) == (not r["trace_exact"])
        if "trace" in r:
            assert len(produced_tokens(r["trace"])) == r["pred_trace_len"]
    assert main(["view", str(out)]) == 0  # the default --out: <folder>/view
    index = (out / "view" / "index.html").read_text()
    assert re.findall(r'<a href="([^"]+\.html)">', index) == ["length-96/rm/eval.html"]
    page = (out / "view" / "length-96" / "rm" / "eval.html").read_text()
    assert len(embedded_data(page)["rows"]) == len(rows) and embedded_data(page)["bins"]


def test_building_pages_reports_progress_per_expression(oracle_eval, tmp_path):
    from rlmlab.experiments.viewer import build_view

    counted = {}

    def stage(name, total, unit):
        counted[name] = [total, 0]
        return lambda k: counted[name].__setitem__(1, counted[name][1] + k)

    build_view(oracle_eval, tmp_path / "v", stage=stage)
    ((total, done),) = counted.values()
    assert total == done > 0


@pytest.mark.slow
def test_the_page_runs_in_a_real_headless_browser(oracle_eval, tmp_path):
    """Chromium (Debian's `chromium`; `apt-get install -y chromium`) loads the page from disk with
    no network, runs its script, draws the list, opens the first wrong answer with its first
    divergence marked, and a `#i` address opens expression i. Run: `python -m pytest -m slow
    tests/test_viewer.py`."""
    import shutil
    import subprocess

    from rlmlab.experiments.viewer import build_view

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "this test drives Debian's chromium: apt-get install -y chromium"
    page = build_view(oracle_eval, tmp_path / "v").path

    def dom(url: str) -> str:
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom"]
        done = subprocess.run([chromium, *flags, url], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    html = dom(page.as_uri())
    import re

    assert len(re.findall(r'<tr class="[a-z ]*" data-i="\d+"', html)) == 30  # every expression listed
    assert re.search(r'<tr class="bad sel" data-i="0"', html)  # it opens on the first wrong answer, row 0
    assert len(re.findall(r'class="cell[a-z ]* first"', html)) == 1  # with its first divergence marked
    assert "first divergence" in html and "Frame stack" in html
    opened = dom(page.as_uri() + "#5")
    assert opened != html and "first divergence" in opened

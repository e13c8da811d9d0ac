"""`rlmlab eval`: the oracle on a text file and on a pool, a saved run, and one-line errors."""

import json

import pytest
import torch
from conftest import sample_expressions

from rlmlab.cli import main
from rlmlab.learning.checkpoint import save_checkpoint
from rlmlab.learning.model import Transformer, preset
from rlmlab.measuring.result_files import read_results
from rlmlab.task.expr import to_text
from rlmlab.task.pool import build_pool, write_pool
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _text_file(tmp_path, n=40, seed=41):
    path = tmp_path / "exprs.txt"
    path.write_text("# a comment\n\n" + "\n".join(to_text(e) for e in sample_expressions(n, seed)) + "\n")
    return path


@pytest.mark.parametrize("learner", ["rm", "cot"])
def test_eval_oracle_on_a_text_file(tmp_path, capsys, learner):
    out = tmp_path / "out"
    assert main(["eval", "--oracle", learner, "--data", str(_text_file(tmp_path)), "--out", str(out),
                 "--quiet", "--by", "max_depth"]) == 0
    printed = capsys.readouterr().out
    assert "final-answer accuracy  100.00%" in printed and "max_depth" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["n"], summary["accuracy"], summary["learner"], summary["predictor"]) == (40, 1.0, learner, "oracle")
    results = read_results(out)
    assert len(results) == 40 and all(r["correct"] and r["trace_exact"] for r in results)


def test_eval_oracle_on_a_pool_with_limit_keeps_ids(tmp_path, monkeypatch):
    pool = tmp_path / "pool.parquet"
    write_pool(build_pool(60, 5, workers=1, task=PAPER), pool)
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--oracle", "rm", "--data", str(pool), "--limit", "25", "--quiet"]) == 0
    results = read_results(tmp_path / "runs" / "oracle-rm" / "eval" / "pool")  # the default --out
    assert [r["id"] for r in results] == list(range(25))


def test_eval_a_saved_run(tmp_path, capsys):
    vocab = PAPER.vocab
    torch.manual_seed(0)
    model = Transformer(preset("tiny", "rm", len(vocab))).eval()
    run = tmp_path / "run"
    save_checkpoint(run, "best", model, vocab=vocab, learner="rm", config={}, step=7, metrics={})
    assert main(["eval", str(run), "--data", str(_text_file(tmp_path, 20)), "--quiet", "--traces",
                 "--max-new-tokens", "50"]) == 0
    assert "per-token (teacher-f.)" in capsys.readouterr().out
    summary = json.loads((run / "eval" / "exprs" / "summary.json").read_text())
    assert summary["step"] == 7 and summary["learner"] == "rm" and summary["n"] == 20
    assert summary["limits"]["max_new_tokens"] == 50
    results = read_results(run / "eval" / "exprs")
    assert all(r["valid"] or r["reason"] for r in results)
    assert all(len(r["trace"].split()) == r["pred_trace_len"] for r in results)


@pytest.mark.parametrize("argv, message", [
    (["--oracle", "rm", "--data", "missing.txt"], "missing.txt: no such file"),
    (["--oracle", "rm", "--data", "{bad}"], "line 3: "),
    (["--oracle", "rm", "--data", "{literal}"], "line 1: '7' is a literal, not a call"),
    (["--oracle", "rm", "--data", "{empty}"], "no expressions"),
    (["--oracle", "rm", "--data", "{noexpr}"], "no 'expr' column"),
    (["--oracle", "rm", "--data", "{binary}"], "not a text file"),
    (["--oracle", "--data", "{good}"], "--oracle needs a learner"),
    (["--data", "{good}"], "give RUN_DIR"),
    (["{run}", "--oracle", "rm", "--data", "{good}"], "not both"),
    (["{run}", "--view", "rm", "--data", "{good}"], "--view goes with --oracle"),
    (["{run}", "--data", "{good}"], "no such run folder"),
    (["--oracle", "cot", "--data", "{good}", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["--oracle", "cot", "--data", "{good}", "--by", "colour"], "--by colour: no such result field"),
])
def test_eval_bad_input_is_one_line_and_status_2(tmp_path, capsys, argv, message):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {"bad": "square(2)\nadd(1,2)\nadd(1,\n", "literal": "7\n", "empty": "# nothing\n\n",
             "good": "square(2)\n"}
    for name, text in files.items():
        (tmp_path / f"{name}.txt").write_text(text)
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "noexpr.parquet")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00\x01")
    paths = {"bad": "bad.txt", "literal": "literal.txt", "empty": "empty.txt", "good": "good.txt",
             "noexpr": "noexpr.parquet", "binary": "binary.txt", "run": "no-such-run"}
    argv = [a.format(**{k: str(tmp_path / v) for k, v in paths.items()}) for a in argv]
    assert main(["eval", *argv, "--quiet", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlmlab eval: error: ") and message in err and "\n" not in err

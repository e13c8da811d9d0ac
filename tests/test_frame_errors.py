"""Teacher-forced errors per active frame: exact attribution to the frames a model gets wrong,
seen/unseen against the training traces, the summary's counts, and `rlmlab frames`."""

import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import sample_expressions

from rlmlab.cli import main
from rlmlab.learning.checkpoint import save_checkpoint
from rlmlab.learning.model import Transformer, preset
from rlmlab.measuring.frame_errors import (
    ALL,
    frame_call,
    frame_records,
    summarize_frames,
    training_calls,
)
from rlmlab.measuring.score import per_token_counts
from rlmlab.task.expr import to_text
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

VOCAB = PAPER.vocab
WORKED = "add(sum_of_squares(2,3),double(4))"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FrameOracle(torch.nn.Module):
    """The true next token of every active-frame prefix (RM's next-token rule is a function of
    the frame: tests/test_well_posed.py), except inside frames of `broken`, where it predicts
    padding: exactly those frames' examples are wrong, on every target."""

    def __init__(self, executions, broken: str):
        super().__init__()
        self.cfg = SimpleNamespace(block_size=4096)
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.broken = VOCAB.ids[broken]
        self.next = {}
        for ex in executions:
            for f in ex.frames:
                ids = VOCAB.encode(f.tokens)
                for j in range(f.m, len(ids)):  # the targets' prefixes (a returned value is context)
                    self.next[tuple(ids[:j])] = ids[j]

    def forward(self, idx):  # (B, T) -> (B, T, V) logits
        B, T = idx.shape
        logits = torch.zeros(B, T, len(VOCAB))
        for b in range(B):
            row = idx[b].tolist()
            for t in range(T):
                nxt = VOCAB.pad_id if row[0] == self.broken else self.next.get(tuple(row[:t + 1]), VOCAB.pad_id)
                logits[b, t, nxt] = 1.0
        return logits


def test_frame_call_is_the_call_at_the_top_of_each_frame():
    ex = PAPER.execute(WORKED)
    calls = [frame_call(f.context) for f in ex.frames]
    assert calls[0] == " ".join(ex.tokens[:ex.prompt_len])  # the root frame: the written expression
    assert "sum_of_squares ( 2 , 3 )" in calls and "add ( square ( 2 ) , square ( 3 ) )" in calls
    for f, call in zip(ex.frames, calls):
        assert f.context[0] == call.split()[0]
        assert to_text(PAPER.parse(call.replace(" ", ""))).replace(" ", "") == call.replace(" ", "")
    with pytest.raises(ValueError, match="no complete call"):
        frame_call(("add", "(", "1", ","))


def test_errors_land_on_exactly_the_frames_a_model_gets_wrong(random_exprs):
    exprs = [e for e in random_exprs[:300] if PAPER.execute(e).trace_len <= 400][:40]
    executions = [PAPER.execute(e) for e in exprs]
    model = FrameOracle(executions, broken="square")
    train = exprs[:20]
    seen = training_calls(train, library=PAPER.library)
    records = frame_records(model, VOCAB, "rm", executions, seen, [{"half": i < 20} for i in range(len(exprs))])
    assert len(records) == sum(ex.n_frame_examples for ex in executions)
    assert any(r["fn"] == "square" for r in records) and any(r["fn"] != "square" for r in records)
    for r in records:
        assert (r["errors"] > 0) == (r["fn"] == "square")
        if r["fn"] == "square":
            assert r["errors"] == r["targets"] and r["first_error"] == 0
        if r["half"]:  # every frame of a training expression was seen in training
            assert r["seen"]
    assert any(not r["seen"] for r in records)
    # The frame records carry every teacher-forced error of the expression, no more.
    counts = per_token_counts(model, VOCAB, "rm", executions)
    for i, (right, total) in enumerate(counts):
        mine = [r for r in records if r["expr_index"] == i]
        assert sum(r["targets"] for r in mine) == total
        assert sum(r["errors"] for r in mine) == total - right


def test_a_cot_model_is_scored_on_the_same_frames():
    executions = [PAPER.execute(e) for e in sample_expressions(30, 5) if PAPER.execute(e).trace_len <= 200][:10]
    torch.manual_seed(0)
    model = Transformer(preset("tiny", "cot", len(VOCAB))).eval()
    records = frame_records(model, VOCAB, "cot", executions)
    counts = per_token_counts(model, VOCAB, "cot", executions)
    for i, (right, total) in enumerate(counts):
        mine = [r for r in records if r["expr_index"] == i]
        assert [r["example"] for r in mine] == list(range(executions[i].n_frame_examples))
        ex = executions[i]
        for r, f in zip(mine, ex.frames):  # `start`: where the example's targets lie in the trace
            assert ex.tokens[r["start"]:r["start"] + r["targets"]] == f.targets
        assert sum(r["errors"] for r in mine) == total - right
        assert "seen" not in mine[0]


def test_summary_counts_add_up(random_exprs):
    exprs = [e for e in random_exprs[:200] if PAPER.execute(e).trace_len <= 300][:30]
    executions = [PAPER.execute(e) for e in exprs]
    records = frame_records(FrameOracle(executions, broken="add"), VOCAB, "rm", executions,
                            training_calls(exprs[:10], library=PAPER.library), [{"ood": i >= 15} for i in range(len(exprs))])
    rows = summarize_frames(records, "ood")
    for group in (False, True):
        mine = [r for r in records if r["ood"] == group]
        both = {r["fn"]: r for r in rows if r["group"] == group and r["seen"] is None}
        assert both[ALL]["n"] == len(mine) == sum(r["n"] for fn, r in both.items() if fn != ALL)
        assert both[ALL]["wrong"] == sum(r["errors"] > 0 for r in mine)
        assert both.get("add", {"wrong": 0})["wrong"] == both[ALL]["wrong"]  # only `add` frames are wrong
        seen = {r["seen"]: r for r in rows if r["group"] == group and r["fn"] == ALL and r["seen"] is not None}
        assert seen[True]["n"] + seen[False]["n"] == len(mine)
        lo, hi = both[ALL]["ci95"]
        assert lo <= both[ALL]["rate"] <= hi


def test_frames_cli(tmp_path, capsys):
    torch.manual_seed(0)
    model = Transformer(preset("tiny", "rm", len(VOCAB)))
    run = tmp_path / "run"
    save_checkpoint(run, "best", model, vocab=VOCAB, learner="rm", config={}, step=3, metrics={})
    exprs = [WORKED, "square(double(3))", "add(square(2),3)", "max(1,2)"]
    data = tmp_path / "set.parquet"
    pq.write_table(pa.table({"expr": exprs, "ood": [False, False, True, True], "bin": ["a", "a", "b", "c"]}), data)
    (tmp_path / "train.txt").write_text("square(double(3))\n")
    out = tmp_path / "frames"
    assert main(["frames", str(run), "--data", str(data), "--train", str(tmp_path / "train.txt"),
                 "--out", str(out), "--per-group", "1"]) == 0
    printed = capsys.readouterr().out
    assert "| function | IID examples | IID wrong (%) |" in printed and "wrong if unseen (%)" in printed
    kept = pq.read_table(out / "frames.parquet").to_pylist()
    # one expression of each bin: the first of "a", then "b" and "c"
    assert sorted({r["expr_index"] for r in kept}) == [0, 1, 2] and {r["bin"] for r in kept} == {"a", "b", "c"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["learner"] == "rm" and summary["expressions"] == 3
    assert (out / "table.md").read_text().splitlines()[0] == printed.splitlines()[1]
    for argv, message in ([str(run), "--data", str(data), "--by", "colour"], "--by colour"), \
                         ([str(run), "--data", str(data), "--top", "0"], "--top"), \
                         ([str(tmp_path / "norun"), "--data", str(data)], "norun"), \
                         ([str(run), "--data", str(data), "--train", str(tmp_path / "none.txt")], "none.txt"):
        assert main(["frames", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1

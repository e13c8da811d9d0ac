"""The invariance probe: zero for g* o Pi_rec and for any RM model, the hand-computed rate for a
predictor that reads beyond the active frame, and the `rlmlab probe` command."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import sample_expressions

from rlmlab.cli import main
from rlmlab.decoding.engine import ModelPredictor
from rlmlab.decoding.oracle import Oracle, oracle_predictor
from rlmlab.decoding.predictor import NO_TOKEN
from rlmlab.learning.checkpoint import save_checkpoint
from rlmlab.learning.model import Transformer, preset
from rlmlab.measuring.probe import (
    completed_calls,
    forced_predictions,
    probe,
    probe_summary,
    summarize_probe,
)
from rlmlab.measuring.result_files import read_results
from rlmlab.task.frames import active_frame
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

VOCAB = PAPER.vocab
WORKED = "add(sum_of_squares(2,3),double(4))"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class SquareAlone:
    """g* o Pi_rec, except that it reads whether anything lies outside the active frame: a
    `square` frame with nothing around it returns its value plus one (then closes its return
    block). Frame-local in the RM driver (there is never anything around a frame)."""

    block_size = None

    def __init__(self):
        self.oracle = Oracle(VOCAB, library=PAPER.library)

    def reset(self, n_slots):
        pass

    def __call__(self, feeds):
        out = []
        for f in feeds:
            seq = VOCAB.decode(f.seq)
            frame = active_frame(seq)
            t = self.oracle.next_id(tuple(VOCAB.encode(frame)))
            if len(frame) == len(seq) and frame[0] == "square" and frame[-1] == "<return>":
                t = VOCAB.ids[str((int(VOCAB.tokens[t]) + 1) % 10)]
            elif t == NO_TOKEN and frame[-2] == "<return>":  # after a wrong value: close the block
                t = VOCAB.ids["</return>"]
            out.append(t)
        return out


def test_oracle_cot_predictor_is_invariant(random_exprs):
    exprs = random_exprs[:120]
    rows = probe(oracle_predictor("cot", VOCAB, library=PAPER.library), "cot", exprs, VOCAB, library=PAPER.library)
    s = probe_summary(rows)
    assert s["positions"] == sum(PAPER.execute(e).trace_len - PAPER.execute(e).prompt_len for e in exprs)
    assert s["position_non_invariant"] == 0 and s["position_correct"] == s["positions"]
    assert s["subproblems"] == sum(PAPER.execute(e).tokens.count("</call>") for e in exprs)  # every call completes
    assert s["answer_non_invariant"] == 0 and s["unparsed"] == 0 and s["subproblems"] > 300
    assert s["position_ci95"][0] == 0.0 and s["answer_ci95"][0] == 0.0


def test_a_predictor_reading_outside_the_frame_scores_the_rate_computed_by_hand(random_exprs):
    # The worked example: 86 prediction points; square(2) and square(3) are the only square
    # calls, both below the root; 5 completed subproblems (sum_of_squares, the inner add,
    # square(2), square(3), double(4)).
    (row,) = probe(SquareAlone(), "cot", [WORKED], VOCAB, library=PAPER.library)
    assert (row["positions"], row["position_differ"], row["witnesses"]) == (86, 2, 2)
    assert (row["subproblems"], row["answer_differ"], row["in_context_correct"], row["alone_correct"]) == (5, 2, 5, 3)
    # On random traces: one point per square call below the root; every square subproblem.
    exprs = [e for e in random_exprs[:400] if PAPER.execute(e).trace_len <= 250][:100]  # SquareAlone is O(n^2)
    rows = probe(SquareAlone(), "cot", exprs, VOCAB, library=PAPER.library)
    for e, r in zip(exprs, rows):
        ex = PAPER.execute(e)
        square = [f for f in ex.frames if f.tokens[0] == "square" and f.tokens[-1] == "</return>"]
        literal = [f for f in square if f.tokens[3] == ")"]  # square(d): nothing but its frame, alone
        root_literal = ex.tokens[0] == "square" and ex.prompt_len == 4  # alone in both readings
        # Pi_rec(x_t) alone is a bare frame at every square's return digit; x_t is one unless
        # it is the root's own frame square(d).
        assert r["position_differ"] == r["witnesses"] == len(square) - root_literal
        # In context a subproblem is never alone; posed alone, square(d) is.
        assert r["answer_differ"] == len(literal) - root_literal
    s = probe_summary(rows)
    assert 0 < s["position_non_invariant"] and s["position_rate"] == s["position_non_invariant"] / s["positions"]


def test_rm_models_are_invariant_by_construction():
    torch.manual_seed(0)
    model = Transformer(preset("tiny", "rm", len(VOCAB))).eval()
    exprs = sample_expressions(40, 41)
    s = probe_summary(probe(ModelPredictor(model), "rm", exprs, VOCAB, library=PAPER.library))
    assert s["positions"] > 1000 and s["position_non_invariant"] == 0
    assert s["answer_non_invariant"] == 0
    # A frame-local predictor that is wrong is still answer-invariant in the RM driver: here
    # every square subproblem is answered wrongly in context and alone alike.
    rows = probe(SquareAlone(), "rm", [WORKED, "add(square(2),3)"], VOCAB, library=PAPER.library)
    s = probe_summary(rows)
    assert s["position_non_invariant"] == 0 and s["subproblems"] >= 2 and s["answer_non_invariant"] == 0
    assert s["in_context_correct"] < s["subproblems"]


def test_teacher_forced_model_predictions_equal_walking_the_predictor():
    torch.manual_seed(1)
    model = Transformer(preset("tiny", "cot", len(VOCAB))).eval()
    exs = [PAPER.execute(e) for e in sample_expressions(30, 42)[:12]]
    rows = [(VOCAB.encode(ex.tokens), ex.prompt_len) for ex in exs]
    rows += [(VOCAB.encode(f.tokens), f.m) for ex in exs[:4] for f in ex.frames]

    class Walk:  # the same model, without the `.model` shortcut: walked with feeds
        def __init__(self):
            self.inner = ModelPredictor(model)
            self.block_size = self.inner.block_size

        def reset(self, n):
            self.inner.reset(n)

        def __call__(self, feeds):
            return self.inner(feeds)

    assert forced_predictions(ModelPredictor(model), rows) == forced_predictions(Walk(), rows, batch_size=5)


def test_completed_calls_and_grouping():
    ex = PAPER.execute(WORKED)
    calls = completed_calls(list(ex.tokens), ex.prompt_len)
    assert [(q, a) for q, a, _ in calls] == [("square ( 2 )", "4"), ("square ( 3 )", "9"),
                                             ("add ( square ( 2 ) , square ( 3 ) )", "3"),
                                             ("sum_of_squares ( 2 , 3 )", "3"), ("double ( 4 )", "8")]
    rows = probe(SquareAlone(), "cot", [WORKED, "add(square(2),3)", "double(4)"], VOCAB,
                 extra=[{"bin": 1}, {"bin": 0}, {"bin": 1}], library=PAPER.library)
    groups = summarize_probe(rows, by=["bin"])
    assert [(g["group_by"], g["group"], g["n_expressions"]) for g in groups] == [(None, None, 3), ("bin", 1, 2), ("bin", 0, 1)]
    assert groups[2]["answer_non_invariant"] == 1 and groups[1]["answer_non_invariant"] == 2
    json.dumps(groups)


def test_probe_cli(tmp_path, capsys):
    torch.manual_seed(0)
    model = Transformer(preset("tiny", "cot", len(VOCAB)))
    run = tmp_path / "run"
    save_checkpoint(run, "best", model, vocab=VOCAB, learner="cot", config={}, step=3, metrics={})
    exprs = ["add(sum_of_squares(2,3),double(4))", "square(double(3))", "add(square(2),3)"]
    data = tmp_path / "set.parquet"
    pq.write_table(pa.table({"expr": exprs, "split": ["train", "test", "test"]}), data)
    (tmp_path / "plain.txt").write_text("\n".join(exprs) + "\n")
    out = tmp_path / "probe"
    assert main(["probe", str(run), "--data", str(data), "--out", str(out), "--by", "split",
                 "--max-new-tokens", "40"]) == 0
    printed = capsys.readouterr().out
    assert "position" in printed and "split" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["learner"] == "cot" and summary["groups"][0]["n_expressions"] == 3
    assert [g["group"] for g in summary["groups"][1:]] == ["train", "test"]  # as they first appear
    assert len(read_results(out, required=("expr",))) == 3
    assert main(["probe", str(run), "--data", str(data), "--out", str(out), "--per-group", "1",
                 "--positions-only"]) == 0
    kept = read_results(out, required=("expr",))
    assert [(r["expr"], r["split"]) for r in kept] == [(exprs[0], "train"), (exprs[1], "test")]
    for argv, message in ([str(run), "--data", str(tmp_path / "none.parquet")], "no such file"), \
                         ([str(tmp_path / "norun"), "--data", str(data)], "norun"), \
                         ([str(run), "--data", str(data), "--by", "colour"], "--by colour"), \
                         ([str(run), "--data", str(data), "--limit", "0"], "--limit"), \
                         ([str(run), "--data", str(tmp_path / "plain.txt"), "--per-group", "2"], "--per-group"), \
                         ([str(run), "--oracle", "cot", "--data", str(data)], "not both"), \
                         (["--data", str(data)], "--oracle LEARNER"), \
                         (["--oracle", "cot", "--data", str(data)], "--out"), \
                         (["--oracle", "window", "--data", str(data), "--out", str(out)], "window:256"):
        assert main(["probe", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1


def test_probe_cli_oracle_reports_zero(tmp_path, capsys):
    """`--oracle cot` probes g* read through CoT's observation: invariant by construction, so both
    rates are exactly zero on real expressions, with the subproblems counted."""
    exprs = ["add(square(2),3)", "square(double(3))", WORKED]
    (tmp_path / "set.txt").write_text("\n".join(exprs) + "\n")
    out = tmp_path / "oracle"
    assert main(["probe", "--oracle", "cot", "--data", str(tmp_path / "set.txt"), "--out", str(out)]) == 0
    assert "oracle:cot" in capsys.readouterr().out
    (overall,) = json.loads((out / "summary.json").read_text())["groups"]
    assert overall["position_rate"] == 0 and overall["answer_rate"] == 0
    assert overall["n_expressions"] == 3 and overall["subproblems"] > 3


def test_progress_counts_every_item_of_every_pass():
    torch.manual_seed(0)
    model = Transformer(preset("tiny", "cot", len(VOCAB))).eval()
    exprs = sample_expressions(12, 5)
    opened, done = [], {}

    def stage(name, total, unit):
        opened.append((name, total, unit))
        done[name] = 0

        def update(k):
            done[name] += k

        return update

    probe(ModelPredictor(model), "cot", exprs, VOCAB, stage=stage, library=PAPER.library)
    assert [n for n, _, _ in opened][:3] == ["probe: in context", "probe: frames alone", "probe: greedy traces"]
    assert opened[0][1] == len(exprs) and opened[2] == ("probe: greedy traces", len(exprs), "expr")
    assert all(done[name] == total for name, total, _ in opened)  # every bar ends full

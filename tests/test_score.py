"""Scoring: Wilson and bootstrap intervals, teacher-forced per-token counts, per-expression results."""

import pytest
import torch
from conftest import sample_expressions

from rlmlab.decoding.driver import Generation, generate
from rlmlab.decoding.engine import ModelPredictor
from rlmlab.decoding.oracle import oracle_predictor
from rlmlab.learning.model import Transformer, preset
from rlmlab.measuring.result_files import read_results, write_results
from rlmlab.measuring.score import (
    answer_accuracy_fn,
    decode_and_score,
    expression_results,
    per_token_counts,
    per_token_hits,
)
from rlmlab.measuring.stats import (
    accuracy,
    bootstrap_ratio,
    group_accuracy,
    summarize,
    wilson,
)
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

VOCAB = PAPER.vocab

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("k, n, lo, hi", [
    (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (5, 10, 0.2366, 0.7634), (1, 10, 0.0179, 0.4042),
    (81, 263, 0.2553, 0.3662), (950, 1000, 0.9347, 0.9619),
])
def test_wilson_known_values(k, n, lo, hi):
    got = wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_bootstrap_keeps_an_expressions_tokens_together():
    # One long expression all right, nine short ones all wrong: 1000/1090 tokens right, but
    # over expressions that is one lucky draw in ten, and the interval says so.
    num, den = [1000] + [0] * 9, [1000] + [10] * 9
    lo, hi = bootstrap_ratio(num, den, n_boot=4000)
    assert lo < 0.5 < 1000 / 1090 <= hi
    assert bootstrap_ratio(num, den, n_boot=4000) == (lo, hi)  # seeded
    # Equal accuracy everywhere: no spread at all.
    assert bootstrap_ratio([3] * 50, [4] * 50) == (0.75, 0.75)
    # More expressions, narrower interval, around the point estimate.
    small = bootstrap_ratio([1, 0] * 10, [1, 1] * 10)
    large = bootstrap_ratio([1, 0] * 1000, [1, 1] * 1000)
    assert small[0] < large[0] < 0.5 < large[1] < small[1]


def _model(learner, seed=0):
    torch.manual_seed(seed)
    return Transformer(preset("tiny", learner, len(VOCAB))).eval()


def test_per_token_hits_equal_a_direct_computation_in_trace_order():
    exs = [ex for ex in map(PAPER.execute, sample_expressions(40, 31)) if ex.trace_len <= 300][:12]
    for learner in ("cot", "rm"):
        model = _model(learner, 1)
        hits = per_token_hits(model, VOCAB, learner, exs, max_tokens=600)
        counts = per_token_counts(model, VOCAB, learner, exs, max_tokens=600)
        for ex, h, (right, total) in zip(exs, hits, counts):
            # Both learners score the same tokens: every generated token is the target of exactly
            # one active-frame example, and the examples cover the trace in order.
            assert total == len(h) == ex.trace_len - ex.prompt_len and right == h.sum()
            rows = [(ex.tokens, ex.prompt_len)] if learner == "cot" else [(f.tokens, f.m) for f in ex.frames]
            want = []
            for toks, first in rows:
                with torch.no_grad():
                    pred = model(torch.tensor(VOCAB.encode(toks))[None])[0].argmax(-1)
                want += [int(pred[j - 1]) == VOCAB.ids[toks[j]] for j in range(first, len(toks))]
            assert h.tolist() == want
        assert 0 < sum(h.sum() for h in hits) < sum(map(len, hits))  # untrained: both outcomes occur


def test_per_token_counts_positions_beyond_the_block_as_wrong():
    ex = PAPER.execute("fibonacci(9,accum_sum(9,3),factorial(9,1))")
    torch.manual_seed(0)
    short = Transformer(preset("tiny", "cot", len(VOCAB), block_size=64)).eval()
    (right, total), = per_token_counts(short, VOCAB, "cot", [ex])
    assert total == ex.trace_len - ex.prompt_len
    ids = VOCAB.encode(ex.tokens)
    with torch.no_grad():
        pred = short(torch.tensor(ids[:64])[None])[0].argmax(-1)
    # tokens up to index 64 are read from positions 0..63; the rest count as wrong
    assert right == sum(int(pred[j - 1]) == ids[j] for j in range(ex.prompt_len, 65))


def test_results_are_flat_and_every_summary_is_recomputable(tmp_path):
    exprs = sample_expressions(40, 32)
    exs = [PAPER.execute(e) for e in exprs]
    gens = generate(oracle_predictor("rm", VOCAB, library=PAPER.library), exprs, VOCAB, "rm", library=PAPER.library)
    # Spoil two: a wrong answer and an invalid trace.
    gens[0] = Generation(gens[0].expr, gens[0].tokens[:-2] + ["X", "</return>"], gens[0].prompt_len, "X", True,
                         None, gens[0].max_depth, gens[0].n_frame_examples, gens[0].fed)
    gens[1] = Generation(gens[1].expr, gens[1].tokens[:7], gens[1].prompt_len, None, False, "</call> with no "
                         "open <call>", 1, 0, 3)
    results = expression_results(gens, exs, per_token=[(1, 2)] * 40, extra=[{"id": i} for i in range(40)])
    assert [r["correct"] for r in results[:3]] == [False, False, True]
    assert results[0]["diverge_at"] == exs[0].trace_len - 2 and results[2]["diverge_at"] is None
    assert results[1]["reason"] == "</call> with no open <call>" and results[1]["prediction"] is None
    assert results[5]["id"] == 5 and results[5]["max_depth"] == exs[5].max_depth
    s = summarize(results)
    assert (s["n"], s["correct"], s["valid"]) == (40, 38, 39 / 40)
    assert s["per_token"] == 0.5 and s["invalid_reasons"] == {"</call> with no open <call>": 1}
    write_results(tmp_path, results, s)
    again = read_results(tmp_path)
    assert again == results and summarize(again) == s
    groups = group_accuracy(again, "max_depth")
    assert sum(g["n"] for g in groups) == 40
    assert [g["group"] for g in groups] == sorted({r["max_depth"] for r in results})
    deep = group_accuracy(again, lambda r: r["max_depth"] > 5)
    assert {g["group"] for g in deep} <= {False, True}
    assert accuracy([])["ci95"] == [0.0, 1.0]


def test_evaluate_with_the_oracle_is_perfect_and_with_a_model_counts_tokens():
    exprs = sample_expressions(30, 33)
    results, s = decode_and_score(oracle_predictor("cot", VOCAB, library=PAPER.library), "cot", exprs, VOCAB, batch_size=7, task=PAPER)
    assert s["accuracy"] == 1.0 and s["trace_exact"] == 1.0 and s["valid"] == 1.0
    assert [r["expr"] for r in results] == [PAPER.execute(e).text for e in exprs]  # input order kept
    model = _model("rm")
    results, s = decode_and_score(ModelPredictor(model), "rm", exprs, VOCAB, model=model, batch_size=16, task=PAPER)
    assert s["per_token_positions"] == sum(PAPER.execute(e).trace_len - PAPER.execute(e).prompt_len for e in exprs)
    assert 0.0 <= s["per_token_ci95"][0] <= s["per_token"] <= s["per_token_ci95"][1] <= 1.0


def test_answer_accuracy_fn_is_a_train_validate_hook():
    exprs = [e for e in sample_expressions(60, 34) if PAPER.trace_stats(e).trace_len <= 100][:20]
    validate = answer_accuracy_fn(exprs, batch_size=8, task=PAPER)  # rows stop after 200 tokens
    got = validate(_model("cot"), VOCAB, "cot")
    assert set(got) == {"answer_acc", "answer_valid"} and 0.0 <= got["answer_acc"] <= got["answer_valid"] <= 1.0

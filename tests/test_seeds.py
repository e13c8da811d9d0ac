"""Training seeds: the seed dimension of the length and depth splits, the spread statistics over
seeds, and reproduction judged against the spread."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmlab.cli import main
from rlmlab.errors import ConfigError
from rlmlab.experiments.kinds.shortcuts import seed_cells, shortcut_seeds_table
from rlmlab.experiments.reproduce import CellCheck, seed_spreads
from rlmlab.experiments.seeds import check_seeds, seed_indices, seed_value, seeded_job, split_seed
from rlmlab.measuring.result_files import read_results
from rlmlab.measuring.stats import correctness, one_run_interval, paired, seed_cell
from rlmlab.runlog import read_metrics


def test_seed_names_and_values():
    assert seeded_job("length-595", 0) == "length-595" and seeded_job("length-595", 2) == "length-595-s2"
    assert split_seed("length-595-s2") == ("length-595", 2) and split_seed("length-595") == ("length-595", 0)
    assert split_seed("iid-N300-s0") == ("iid-N300", 0)
    assert seed_value(0) == 1337 and seed_value(2) == 1339  # seed 0 is the seed every committed run used
    assert check_seeds(None) == [0] and check_seeds([2, 0, 2]) == [0, 2]
    for bad in ([], [-1], [100], [True]):
        with pytest.raises(ConfigError):
            check_seeds(bad)


def test_seed_indices_reads_the_folders(tmp_path):
    assert seed_indices(tmp_path, "depth-10") == [0]  # nothing yet: reads as a single-seed folder
    for name in ("depth-10", "depth-10-s2", "depth-10-s1", "depth-100-s1", "depth-10-sx"):
        (tmp_path / name).mkdir()
    assert seed_indices(tmp_path, "depth-10") == [0, 1, 2]


def _results(exprs, correct):
    return [{"expr": e, "correct": bool(c)} for e, c in zip(exprs, correct)]


def test_cell_over_seeds_and_expressions():
    rng = np.random.default_rng(0)
    m = (rng.random((3, 200)) < np.array([[0.9], [0.6], [0.75]])).astype(float)
    c = seed_cell(m)
    assert c["mean"] == pytest.approx(m.mean()) and c["per_seed"] == pytest.approx(list(m.mean(axis=1)))
    assert (c["min"], c["max"]) == (min(c["per_seed"]), max(c["per_seed"]))
    lo, hi = c["ci95"]
    assert lo < c["mean"] < hi
    # Resampling the seeds too: wider than a bootstrap over expressions with the seeds fixed.
    same = seed_cell(np.repeat(m.mean(axis=0, keepdims=True) > 0.5, 3, axis=0).astype(float))
    assert hi - lo > same["ci95"][1] - same["ci95"][0]
    assert seed_cell(m) == c  # a fixed bootstrap seed: a report regenerates byte for byte
    one = seed_cell(m[:1])
    assert one["seeds"] == 1 and one["ci95"][0] <= one["mean"] <= one["ci95"][1]


def test_one_run_interval_holds_every_seed_where_the_means_need_not():
    # Like RM at N = 300 of the IID sweep: two seeds near 62%, one at 53%, 5,000 expressions.
    rng = np.random.default_rng(2)
    m = (rng.random((3, 5000)) < np.array([[0.61], [0.53], [0.63]])).astype(float)
    per_seed = m.mean(axis=1)
    lo, hi = seed_cell(m)["ci95"]
    assert lo > per_seed.min()  # the mean's interval leaves the low seed out
    run_lo, run_hi = one_run_interval(m)
    assert run_lo <= per_seed.min() and per_seed.max() <= run_hi
    assert run_lo < lo and hi < run_hi  # it is wider than the mean's: a run varies more than a mean of three
    assert one_run_interval(m) == [run_lo, run_hi]  # fixed bootstrap seed


@given(k=st.integers(2, 6), n=st.integers(20, 400), rates=st.lists(st.floats(0, 1), min_size=6, max_size=6),
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_one_run_interval_contains_each_seeds_value(k, n, rates, seed):
    rng = np.random.default_rng(seed)
    m = (rng.random((k, n)) < np.array(rates[:k])[:, None]).astype(float)
    lo, hi = one_run_interval(m)
    assert all(lo <= x <= hi for x in m.mean(axis=1))
    # Per token: hits out of 5-15 targets an expression, each seed's ratio inside too.
    t = rng.integers(5, 16, size=(k, n)).astype(float)
    c = np.floor(t * m * rng.random((k, n)) + t * (1 - m) * 0.3)
    lo, hi = one_run_interval(c, t)
    assert all(lo <= x <= hi for x in c.sum(axis=1) / t.sum(axis=1))


def test_paired_difference_and_verdict():
    rng = np.random.default_rng(1)
    a = (rng.random((3, 300)) < 0.95).astype(float)
    b = (rng.random((3, 300)) < 0.20).astype(float)
    d = paired(a, b)
    assert d["diff"] == pytest.approx(a.mean() - b.mean()) and d["verdict"] == "higher"
    assert paired(b, a)["verdict"] == "lower"
    assert paired(a, a)["diff"] == 0 and paired(a, a)["verdict"] == "not separated"
    with pytest.raises(ValueError):
        paired(a, b[:, :10])


def test_correctness_refuses_seeds_scored_on_other_expressions():
    r0 = _results(["a", "b"], [1, 0])
    assert correctness([r0, _results(["a", "b"], [1, 1])], "x").tolist() == [[1, 0], [1, 1]]
    with pytest.raises(ValueError, match="same expressions"):
        correctness([r0, _results(["b", "a"], [1, 1])], "x")


def test_reproduction_is_judged_against_the_seed_spread():
    report = {"seeds": {"bins": ["1.0-1.25"], "learners": {
        "rm": {"seeds": [0, 1, 2], "cells": [{"mean": 0.9, "ci95": [0.85, 0.95],
                                              "per_seed": {"0": 0.97, "1": 0.84, "2": 0.9}}]},
        "cot": {"seeds": [0], "cells": [{"mean": 0.1, "ci95": [0.05, 0.15], "per_seed": {"0": 0.1}}]}}}}
    spreads = seed_spreads(report)
    assert set(spreads) == {"rows[bin=1.0-1.25].rm"}  # one seed: no spread, the Wilson rule stands
    assert spreads["rows[bin=1.0-1.25].rm"] == {"seeds": 3, "lo": 0.84, "hi": 0.97}
    committed = {"n": 310, "accuracy": 0.97, "ci95": [0.945, 0.985]}
    fresh = {"n": 310, "accuracy": 0.86, "ci95": [0.82, 0.90]}
    assert not CellCheck("c", committed, fresh).inside  # one run's intervals: disagree
    assert CellCheck("c", committed, fresh, spreads["rows[bin=1.0-1.25].rm"]).inside  # within the seeds
    assert not CellCheck("c", committed, {**fresh, "accuracy": 0.7}, spreads["rows[bin=1.0-1.25].rm"]).inside
    # A sample of ten (`reproduce --sample 10`): ten of ten right is not evidence against 84-97%.
    sample = {"n": 10, "accuracy": 1.0, "ci95": [0.722, 1.0]}
    assert CellCheck("c", committed, sample, spreads["rows[bin=1.0-1.25].rm"]).inside
    assert not CellCheck("c", committed, {"n": 10, "accuracy": 0.3, "ci95": [0.108, 0.603]},
                         spreads["rows[bin=1.0-1.25].rm"]).inside
    assert not CellCheck("c", committed, {**fresh, "accuracy": 1.0, "ci95": [0.988, 1.0]},
                         spreads["rows[bin=1.0-1.25].rm"]).inside  # the whole set: the spread itself


def test_length_split_trains_seeds_on_the_same_split_and_reports_the_spread(tmp_path):
    out = tmp_path / "length"
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--seeds", "0,1", "--quiet"]) == 0
    for learner in ("rm", "cot"):
        s0, s1 = out / "length-96" / learner, out / "length-96-s1" / learner
        assert json.loads((s0 / "config.json").read_text())["train"]["seed"] == 1337
        assert json.loads((s1 / "config.json").read_text())["train"]["seed"] == 1338
        for key in ("train", "val"):  # the same split for every seed
            assert json.loads((s0 / "config.json").read_text())["data"][key] == \
                json.loads((s1 / "config.json").read_text())["data"][key]
        e0, e1 = read_results(s0 / "eval"), read_results(s1 / "eval")
        assert [r["expr"] for r in e0] == [r["expr"] for r in e1]  # scored on the same expressions
        losses = [[r["loss"] for r in read_metrics(d) if r["kind"] in ("train", "val")] for d in (s0, s1)]
        assert losses[0] and losses[1] and losses[0] != losses[1]  # another initialisation and data order
    assert main(["report", str(out)]) == 0
    saved = json.loads((out / "report" / "report.json").read_text())
    spread = saved["seeds"]
    assert set(spread["learners"]) == {"rm", "cot"} and spread["learners"]["rm"]["seeds"] == [0, 1]
    assert [p["a"] + "-" + p["b"] for p in spread["paired"]] == ["rm-cot"]
    table = (out / "report" / "table-length-96.md").read_text()
    assert "Over training seeds" in table and "RM, seed 0, acc. (%)" in table and "Paired differences" in table
    assert "RM: mean over seeds (%)" in table and "RM: seeds 0, 1 (" in table
    assert [t["job"] for t in saved["training"]] == ["length-96", "length-96", "length-96-s1", "length-96-s1"]
    # A learner's out-of-domain mean stands only when every seed fitted (the smoke runs do not).
    rm = spread["learners"]["rm"]
    ood = [c for c, b in zip(rm["cells"], json.loads((out / "experiment.json").read_text())["split"]["bins"])
           if b["ood"] and c is not None]
    assert ood and all(c["mean"] is None for c in ood) == (len(rm["fitted_seeds"]) < 2)


def test_shortcut_cells_over_seeds():
    """Table 3 over seeds: IID, OOD and the shortcut rate (answers equal to S) as seeds ×
    expressions cells; out of domain only where every seed fitted (IID >= 99%)."""
    iid = [f"iid{i}" for i in range(200)]
    ood = [f"ood{i}" for i in range(100)]

    def sets(iid_right, follow):  # OOD: the first `follow` answers equal S, the rest the answer
        return ([{"expr": e, "correct": i < iid_right} for i, e in enumerate(iid)],
                [{"expr": e, "correct": i >= follow, "prediction": "3" if i < follow else "5", "signal": "3"}
                 for i, e in enumerate(ood)])

    fitted_both = seed_cells("near_answer_aggregate", "cot", {0: sets(200, 80), 1: sets(199, 60), 2: (None, None)})
    assert fitted_both["seeds"] == [0, 1] == fitted_both["fitted_seeds"]  # seed 2 not evaluated yet
    assert fitted_both["iid"]["per_seed"] == [1.0, 0.995]
    assert fitted_both["shortcut_rate"]["per_seed"] == [0.8, 0.6] and fitted_both["shortcut_rate"]["mean"] == 0.7
    assert fitted_both["ood"]["per_seed"] == pytest.approx([0.2, 0.4])
    lo, hi = fitted_both["shortcut_rate"]["ci95"]
    assert lo < 0.7 < hi
    one_unfit = seed_cells("near_answer_aggregate", "cot", {0: sets(200, 80), 1: sets(190, 60)})
    assert one_unfit["fitted_seeds"] == [0] and one_unfit["ood"] is None is one_unfit["shortcut_rate"]
    assert seed_cells("near_answer_aggregate", "cot", {0: sets(200, 80)}) is None  # one seed: no spread
    lines = shortcut_seeds_table([fitted_both, one_unfit]).splitlines()
    assert lines[-2].startswith("| near_answer_aggregate | CoT | 0, 1 (2 of 2) | 99.8 [")
    assert "| 80.0 / 60.0 |" in lines[-2] and lines[-2].endswith("| 80.0 / 60.0 |")
    assert lines[-1].endswith("| 0, 1 (1 of 2) | 97.5 [" + lines[-1].split("| 97.5 [")[1].split("]")[0]
                              + "] | 100.0 / 95.0 | not fitted | – | not fitted | – |")


def test_a_folder_holding_only_seeds_1_and_2_reports(tmp_path, capsys):
    """`rlmlab run length --seeds 1,2` prints `rlmlab report OUT`: the report reads the lowest
    seed a job has as its first, and the spread over both."""
    out = tmp_path / "length-197-small"
    shutil.copytree(Path(__file__).resolve().parent.parent / "results" / "length-197-small", out)
    (out / "length-197").rename(out / "length-197-s1")
    shutil.copytree(out / "length-197-s1", out / "length-197-s2")
    assert main(["report", str(out)]) == 0, capsys.readouterr().err
    table = (out / "report" / "table-length-197.md").read_text()
    assert "| RM, seed 1, acc. (%) |" in table and "RM: seeds 1, 2 (" in table

"""The threshold sweep: one folder of length and depth thresholds, its report, importing a
single-threshold experiment into it, and the sizing plan (`rlmlab run sweep --plan`)."""

import functools
import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmlab.cli import main
from rlmlab.errors import ConfigError
from rlmlab.experiments.kinds.sweep import sweep_points, sweep_table
from rlmlab.experiments.presets import get_preset
from rlmlab.experiments.sizing import lane_stats, pool_lane_columns, size_threshold
from rlmlab.experiments.splits import DEPTH_BINS, LENGTH_BINS
from rlmlab.learning.examples import build_examples, rm_lanes_packing
from rlmlab.measuring.result_files import has_results, read_results, write_rows
from rlmlab.records import write_records
from rlmlab.runlog import read_metrics
from rlmlab.task.sampler import ExpressionSampler, GeneratorConfig
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.2, 0.4, 0.6]))
def test_lane_statistics_are_those_of_the_lane_view(seed, p_lit):
    expr = ExpressionSampler(PAPER.library, GeneratorConfig(p_lit=p_lit)).sample(random.Random(seed))
    ex = PAPER.execute(expr)
    lanes = rm_lanes_packing(ex)
    s = lane_stats(expr, library=PAPER.library)
    assert s.tokens == sum(len(x.tokens) for x in lanes)
    assert s.frames == len(lanes)
    assert s.longest == max(len(x.tokens) for x in lanes)
    assert s.prompt == ex.prompt_len


def _split_params(bins, threshold, sampled=4):
    return {"threshold": threshold, "t_max": 40 + threshold, "n_train": 1000,
            "bins": [{"label": b.label, "ood": b.ood, "lo": str(b.lo), "hi": None if b.hi is None else str(b.hi),
                      "available": sampled, "sampled": sampled} for b in bins]}


# Hand-made runs in both forms the report reads: legacy JSON lines and Parquet.
FORMS = ["jsonl", "parquet"]


def _fake_run(out, job, learner, bins, correct_iid, correct_ood, best, positions="learned", frame_width=513,
              form="jsonl"):
    run = out / job / learner
    (run / "eval" / "eval").mkdir(parents=True)
    results = []
    for b in bins:
        for i in range(4):
            ok = (correct_ood if b.ood else correct_iid) > i
            # The last bin's first expression has a trace past CoT's 4,096 positions of the `cpu` model.
            long = b.label == bins[-1].label and i == 0
            results.append({"expr": f"add({i},{b.index})", "correct": ok, "bin": b.label, "ood": b.ood,
                            "within_tmax": True, "valid": True, "trace_len": 4098 if long else 4097,
                            "max_frame_width": frame_width})
    (run / "config.json").write_text(json.dumps({"model": {"preset": "cpu", "block_size": None, "positions": positions},
                                                 "data": {"learner": learner.partition("@")[0]}, "train": {}}))
    log = [{"kind": "val", "step": 10, "answer_acc": best, "elapsed_s": 1.0}]
    if form == "parquet":
        write_rows(run / "eval" / "eval", results)
        write_records(run / "metrics.parquet", log)
    else:
        (run / "eval" / "eval" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))


@pytest.mark.parametrize("form", FORMS)
def test_out_of_domain_cells_only_for_fitted_learners(tmp_path, form):
    fake_run = functools.partial(_fake_run, form=form)
    meta = {"kind": "sweep", "splits": {"length-33": _split_params(LENGTH_BINS, 33),
                                        "length-96": _split_params(LENGTH_BINS, 96),
                                        "depth-5": _split_params(DEPTH_BINS, 5)}}
    fake_run(tmp_path, "length-33", "rm", LENGTH_BINS, 4, 3, 0.995)
    fake_run(tmp_path, "length-33", "cot", LENGTH_BINS, 4, 1, 0.98)  # below 99%: not fitted
    fake_run(tmp_path, "length-96", "rm", LENGTH_BINS, 4, 2, 1.0)
    fake_run(tmp_path, "depth-5", "cot", DEPTH_BINS, 3, 0, 0.99)
    points = sweep_points(tmp_path, meta)
    assert [(p["split"], p["threshold"], p["learner"]) for p in points] == [
        ("length", 33, "rm"), ("length", 33, "cot"), ("length", 96, "rm"), ("depth", 5, "cot")]
    rm33, cot33, rm96, cot5 = points
    assert rm33["below"]["accuracy"] == 1.0 and rm33["ood"]["1.0-1.25"]["accuracy"] == 0.75
    assert not cot33["fitted"] and all(a is None for a in cot33["ood"].values())
    assert cot33["below"]["accuracy"] == 1.0  # below the threshold is shown either way
    assert cot5["fitted"] and cot5["below"]["accuracy"] == 0.75 and cot5["ood"]["1.1"]["accuracy"] == 0.0
    md = sweep_table("length", points)
    rows = {line.split(" | ")[0] + " " + line.split(" | ")[1]: line
            for line in md.splitlines()[2:] if line.startswith("| ")}
    assert rows["| 33 CoT"].count("not fitted") == 7 and "| 98.0 | 100.0 |" in rows["| 33 CoT"]
    assert rows["| 33 RM"].endswith("| 75.0 | 75.0 | 75.0 | 75.0 | 75.0 | 75.0 | 75.0 |")
    assert rows["| 96 n"] == "| 96 | n | | | | 12 | 4 | 4 | 4 | 4 | 4 | 4 | 4 |"
    assert "×1.1" in sweep_table("depth", points) and sweep_table("depth", []) == ""
    # Cells holding expressions that need more positions than the learner's table say so.
    assert [p["beyond_table"] for p in points] == [{}, {">5.0": 1}, {}, {">=2.2": 1}]
    assert "- L = 33, CoT: 1 of 4 in ×>5.0" in md


@pytest.mark.parametrize("form", FORMS)
def test_only_a_learned_table_limits_the_context(tmp_path, form):
    """An encoding without a table (NoPE, RoPE) decodes past the training length: none of its
    expressions is counted beyond a table, whatever its learner's name."""
    fake_run = functools.partial(_fake_run, form=form)
    meta = {"kind": "sweep", "splits": {"length-33": _split_params(LENGTH_BINS, 33),
                                        "length-96": _split_params(LENGTH_BINS, 96)}}
    fake_run(tmp_path, "length-33", "cot", LENGTH_BINS, 4, 3, 0.995)
    fake_run(tmp_path, "length-33", "cot@none", LENGTH_BINS, 4, 3, 0.995, positions="none")
    fake_run(tmp_path, "length-33", "rm@rope", LENGTH_BINS, 4, 3, 0.995, positions="rope", frame_width=514)
    fake_run(tmp_path, "length-33", "rm", LENGTH_BINS, 4, 3, 0.995, frame_width=514)
    # The plain names with another encoding set by `--model.positions`.
    fake_run(tmp_path, "length-96", "cot", LENGTH_BINS, 4, 3, 0.995, positions="rope")
    fake_run(tmp_path, "length-96", "rm", LENGTH_BINS, 4, 3, 0.995, positions="alibi", frame_width=514)
    table = {(p["threshold"], p["learner"]): p["beyond_table"] for p in sweep_points(tmp_path, meta)}
    # Frames of 514 tokens: RM reads 513 before the last, one past its 512-position table.
    assert table == {(33, "cot"): {">5.0": 1}, (33, "cot@none"): {}, (33, "rm@rope"): {},
                     (33, "rm"): {b.label: 4 for b in LENGTH_BINS}, (96, "cot"): {}, (96, "rm"): {}}


def test_sweep_runs_resumes_reports_and_takes_in_a_single_threshold_experiment(tmp_path, capsys):
    sweep, single = tmp_path / "sweep", tmp_path / "single"
    assert main(["run", "sweep", "--preset", "smoke", "--out", str(sweep), "--depths", "3", "--quiet"]) == 0
    meta = json.loads((sweep / "experiment.json").read_text())
    assert (meta["kind"], list(meta["splits"])) == ("sweep", ["depth-3"])
    assert has_results(sweep / "depth-3" / "rm" / "eval")
    assert main(["run", "length", "--preset", "smoke", "--out", str(single), "--quiet"]) == 0
    assert main(["report", str(single)]) == 0
    # Another pool is another sweep: refused before anything is built.
    assert main(["run", "sweep", "--preset", "smoke", "--preset.pool_n=3000", "--out", str(sweep),
                 "--lengths", "96", "--quiet"]) == 2
    assert not (sweep / "length-96").exists()

    # The single-threshold runs join the sweep's export without retraining, and its command is
    # stored as the sweep command that trains the same job.
    dest = tmp_path / "results"
    assert main(["export", str(sweep), str(dest)]) == 0
    assert main(["export", str(single), str(dest)]) == 0
    meta = json.loads((dest / "experiment.json").read_text())
    assert (meta["kind"], sorted(meta["splits"])) == ("sweep", ["depth-3", "length-96"])
    assert meta["splits"]["length-96"] == json.loads((single / "experiment.json").read_text())["split"]
    for name in ("length-96/cot/eval/results.parquet", "data/length-96/split.json"):
        assert (dest / name).read_bytes() == (single / name).read_bytes(), name
    assert read_results(dest / "length-96/cot/eval") == read_results(single / "length-96/cot/eval")
    assert (dest / "length-96/rm/metrics.parquet").exists()  # the training log, converted as exported
    assert read_metrics(dest / "length-96/rm") == read_metrics(single / "length-96/rm") != []
    commands = [json.loads(line) for line in (dest / "commands.jsonl").read_text().splitlines()]
    assert commands[-1]["argv"][:3] == ["rlmlab", "run", "sweep"] and "--lengths=96" in commands[-1]["argv"]
    assert commands[-1]["imported"][:3] == ["rlmlab", "run", "length"]
    for name in ("table-length-96.md", "table-depth-3.md", "table-sweep.md", "sweep.png", "sweep.pdf"):
        assert (dest / "report" / name).exists(), name
    name = "report/table-length-96.md"
    assert (dest / name).read_bytes() == (single / name).read_bytes()
    table = (dest / "report" / "table-sweep.md").read_text()
    assert "Length split" in table and "Depth split" in table and table.count("not fitted") == 2 * 7 * 2

    # In a results tree where the single-threshold folder is exported too, the sweep refers to
    # its runs instead of holding a second copy, and reports the same tables.
    tree = tmp_path / "tree"
    assert main(["export", str(single), str(tree / "length")]) == 0
    assert main(["export", str(sweep), str(tree / "sweep")]) == 0
    capsys.readouterr()
    assert main(["export", str(single), str(tree / "sweep")]) == 0
    assert "2 run(s) a folder beside it holds byte for byte are kept there" in capsys.readouterr().out
    refs = json.loads((tree / "sweep" / "refs.json").read_text())["runs"]
    assert sorted(refs) == ["length-96/cot", "length-96/rm"] and not (tree / "sweep" / "length-96").exists()
    assert refs["length-96/rm"]["path"] == "../length/length-96/rm"
    for name in ("table-sweep.md", "table-length-96.md"):
        assert (tree / "sweep" / "report" / name).read_bytes() == (dest / "report" / name).read_bytes(), name

    # Into the sweep's own run folder too: running the threshold then has nothing to train; its
    # split (left out of the export) is rebuilt from the pool and must come out the same.
    assert main(["export", str(single), str(sweep)]) == 0
    stamp = (sweep / "length-96" / "rm" / "eval" / "summary.json").stat().st_mtime
    assert main(["run", "sweep", "--preset", "smoke", "--out", str(sweep), "--lengths", "96", "--quiet"]) == 0
    assert (sweep / "length-96" / "rm" / "eval" / "summary.json").stat().st_mtime == stamp
    assert (sweep / "data" / "length-96" / "train.parquet").exists()
    assert not (sweep / "length-96" / "rm" / "best").exists()  # nothing was trained
    # A single-threshold folder still holds only its own experiment.
    assert main(["run", "length", "--preset", "smoke", "--out", str(sweep), "--quiet"]) == 2


def test_sweep_options_are_checked_before_anything_is_written(tmp_path):
    out = tmp_path / "x"
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--lengths", "96"]) == 2
    assert main(["run", "sweep", "--preset", "smoke", "--out", str(out), "--threshold", "96"]) == 2
    assert main(["run", "sweep", "--preset", "smoke", "--out", str(out), "--lengths", "0"]) == 2
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--plan"]) == 2
    assert main(["run", "sweep", "--preset", "smoke", "--out", str(out), "--plan", "--pool", str(tmp_path / "no")]) == 2
    assert not out.exists()


def test_plan_counts_are_those_of_the_built_views(tmp_path, capsys):
    from rlmlab.experiments.splits import threshold_split
    from rlmlab.task.pool import build_pool

    p = get_preset("smoke")
    pool = build_pool(p.pool_n, p.pool_seed, task=PAPER)
    cols = {"trace_len": np.asarray(pool.column("trace_len").to_numpy(), dtype=np.int64),
            "max_frame_width": np.asarray(pool.column("max_frame_width").to_numpy(), dtype=np.int64),
            **pool_lane_columns(pool.column("expr").to_pylist(), library=PAPER.library)}
    split = threshold_split(pool, "length", 96, n_val=p.n_val, per_bin_cap=p.per_bin_cap)
    ids = {i: k for k, i in enumerate(pool.column("id").to_pylist())}
    rows = {t: np.array([ids[i] for i in getattr(split, t).column("id").to_pylist()]) for t in ("train", "val", "eval")}
    rows["ood"] = np.array(split.eval.column("ood").to_pylist())
    sized = size_threshold(cols, rows, p, ("rm", "cot"), "length", 96)
    train = split.train.column("expr").to_pylist()
    for learner in ("rm", "cot"):
        data = build_examples(train, learner, PAPER.vocab, task=PAPER)
        lv = sized["learners"][learner]
        built = (len(data), data.n_tokens, int((data.lengths - 1).sum()))
        assert (lv["examples"], lv["tokens"], lv["positions"]) == built
    assert sized["n_train"] == len(train) and sized["t_max"] == split.params["t_max"]
    # a learner is sized by what it reads, not by its name: CoT with RoPE reads the whole trace
    encoded = size_threshold(cols, rows, p, ("cot@rope", "rm@none"), "length", 96)["learners"]
    for name, base in (("cot@rope", "cot"), ("rm@none", "rm")):
        assert {k: v for k, v in encoded[name].items() if k != "steps"} == \
            {k: v for k, v in sized["learners"][base].items() if k != "steps"}
    with pytest.raises(ConfigError, match="not 'reduce'"):
        size_threshold(cols, rows, p, ("reduce",), "length", 96)
    generated = sum(len(PAPER.execute(e).tokens) - PAPER.execute(e).prompt_len for e in split.eval.column("expr").to_pylist())
    assert sized["eval_generated"] == generated

    # The command prints the plan and writes nothing.
    out = tmp_path / "plan"
    assert main(["run", "sweep", "--preset", "smoke", "--out", str(out), "--lengths", "96,197", "--depths", "3",
                 "--plan", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert not out.exists()
    assert "| length | 96 | rm |" in text and "| depth | 3 | cot |" in text
    assert f"| length | 96 | {len(train):,} |" in text


def test_the_sweep_figure_breaks_a_line_at_a_threshold_without_a_cell(tmp_path, monkeypatch):
    """A learner trained at L = 33 and 359 but not at 96 (another learner was) gets no segment
    across 96: the figure draws only what was measured."""
    import math

    import matplotlib.axes

    from rlmlab.experiments.kinds.sweep import plot_sweep

    drawn = []
    real_plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **k: drawn.append((list(a[0]), list(a[1]))) or real_plot(self, *a, **k))

    def point(learner, threshold, acc):
        cell = {"accuracy": acc}
        return {"split": "length", "threshold": threshold, "learner": learner, "fitted": True,
                "below": cell, "ood": {"1.0-1.25": cell}}

    points = [point("rm", t, 0.9) for t in (33, 96, 359)] + [point("cot", t, 0.5) for t in (33, 359)]
    plot_sweep(tmp_path / "sweep", points)
    assert (tmp_path / "sweep.png").exists()
    cot = [ys for xs, ys in drawn if ys and ys[0] == 50.0]
    assert len(cot) == 2  # below the threshold and the one out-of-domain bin
    for ys in cot:
        assert ys[0] == 50.0 and math.isnan(ys[1]) and ys[2] == 50.0
    rm = [ys for xs, ys in drawn if ys and ys[0] == 90.0]
    assert len(rm) == 2 and all(ys == [90.0, 90.0, 90.0] for ys in rm)

"""The experiment runner and the report, end to end in smoke form (tiny model, a few steps)."""

import dataclasses
import json
import shutil
import sys
from fractions import Fraction

import pyarrow.parquet as pq
import pytest

from rlmlab.cli import main
from rlmlab.errors import ConfigError, DataError
from rlmlab.experiments.kinds import get_kind
from rlmlab.experiments.presets import EXPERIMENT_PRESETS, get_preset
from rlmlab.experiments.report import report
from rlmlab.experiments.run import run_jobs
from rlmlab.measuring.result_files import has_results, read_results
from rlmlab.runlog import read_metrics
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

RECORD_FILES = ("results.parquet", "traces.parquet", "metrics.parquet")


def test_length_experiment_runs_resumes_and_reports(tmp_path, capsys):
    out = tmp_path / "length"
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--quiet"]) == 0
    for learner in ("rm", "cot"):
        assert (out / "length-96" / learner / "done.json").exists()
        results = read_results(out / "length-96" / learner / "eval")
        assert len(results) == 40 and {r["bin"] for r in results} == {b["label"] for b in
                                                                      json.loads((out / "experiment.json").read_text())
                                                                      ["split"]["bins"]}
    stamp = (out / "length-96" / "rm" / "eval" / "summary.json").stat().st_mtime
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--quiet"]) == 0  # resumes: no work
    assert (out / "length-96" / "rm" / "eval" / "summary.json").stat().st_mtime == stamp
    assert main(["report", str(out)]) == 0
    table = (out / "report" / "table-length-96.md").read_text()
    assert "RM acc. (%)" in table and "CoT acc. (%)" in table and "Gap (pt)" in table
    for name in ("bins-length-96.png", "bins-length-96.pdf", "table-length-96.tex", "report.json"):
        assert (out / "report" / name).exists()
    saved = json.loads((out / "report" / "report.json").read_text())
    assert sum(r["rm"]["n"] for r in saved["rows"] if r.get("rm")) == 40
    # The training table is read from each run's training log: steps, best validation, stop rule.
    for t in saved["training"]:
        done = json.loads((out / "length-96" / t["learner"] / "done.json").read_text())
        assert (t["step"], t["best"], t["best_step"], t["stop"]) == \
            (done["step"], done["best_score"], done["best_step"], done["stop_reason"])
    assert [t["learner"] for t in saved["training"]] == ["rm", "cot"]
    for t in saved["training"]:  # every validation logs its own time, so none is left out
        vals = [r for r in read_metrics(out / "length-96" / t["learner"]) if r["kind"] == "val"]
        assert t["validations_untimed"] == 0
        assert abs(t["validation_minutes"] * 60 - sum(v["val_s"] for v in vals)) < 1e-9
        assert 0 < t["validation_minutes"] < t["minutes"]
    training = (out / "report" / "table-training.md").read_text()
    for t in saved["training"]:  # each run's validation curve, one line per run
        curve = next(line for line in training.splitlines()
                     if line.startswith(f"- length-96 {'RM' if t['learner'] == 'rm' else 'CoT'}: "))
        assert curve.count(" min)") == len(t["validations"]) > 0
    assert "| length-96 | CoT |" in capsys.readouterr().out  # `rlmlab report` prints it with the tables

    # Exporting keeps results, configs and curves but no weights or data, and rebuilds the report;
    # the per-expression results and the training logs it copies land as Parquet, record for record.
    dest = tmp_path / "results" / "length-smoke"
    dest.mkdir(parents=True)
    (dest / "README.md").write_text("notes")
    assert main(["export", str(out), str(dest)]) == 0
    assert not list(dest.rglob("*.safetensors")) and not [p for p in dest.rglob("*.parquet") if p.name not in RECORD_FILES]
    assert not list(dest.rglob("results.jsonl")) and not list(dest.rglob("metrics.jsonl"))
    assert not (dest / "length-96" / "rm" / "best").exists() and (dest / "README.md").read_text() == "notes"
    for name in ("length-96/rm/eval/results.parquet", "length-96/cot/config.json", "commands.jsonl",
                 "data/length-96/split.json", "report/table-length-96.md", "report/table-training.md"):
        assert (dest / name).read_bytes() == (out / name).read_bytes(), name
    for learner in ("rm", "cot"):
        run, exported = out / "length-96" / learner, dest / "length-96" / learner
        assert read_results(exported / "eval") == read_results(run / "eval")
        assert (exported / "metrics.parquet").exists() and read_metrics(exported) == read_metrics(run) != []
    assert main(["export", str(out), str(out / "copy")]) == 2  # not into the folder it copies
    assert main(["export", str(dest / "length-96"), str(tmp_path / "x")]) == 2  # not an experiment folder

    # The invariance probe of a learner puts its per-bin rates into the table.
    assert main(["probe", str(out / "length-96" / "cot"), "--data", str(out / "data" / "length-96" / "eval.parquet"),
                 "--per-group", "2", "--max-new-tokens", "60"]) == 0
    assert main(["report", str(out)]) == 0
    table = (out / "report" / "table-length-96.md").read_text()
    probed = [line for line in table.splitlines() if line.startswith("| CoT probed expressions")]
    assert probed and probed[0].count("| 2 ") == 10
    # Smoke runs do not fit: their probe rows say so, as their accuracy rows do.
    assert "| CoT, not fitted, non-invariant positions (%)" in table
    assert "| CoT, not fitted, non-invariant answers (%)" in table

    # Frame errors of a learner (rlmlab frames) join the table as a section of their own.
    frames = out / "length-96" / "rm" / "frames" / "eval"
    assert main(["frames", str(out / "length-96" / "rm"), "--data", str(out / "data" / "length-96" / "eval.parquet"),
                 "--train", str(out / "data" / "length-96" / "train.parquet"), "--per-group", "1"]) == 0
    assert main(["report", str(out)]) == 0
    table = (out / "report" / "table-length-96.md").read_text()
    assert "Teacher-forced errors per active-frame example, RM, not fitted (best validation" in table
    assert (frames / "table.md").read_text().splitlines()[0] in table.splitlines()
    (frames / "summary.json").write_text(json.dumps({"rows": [{"fn": "add"}]}))
    assert main(["report", str(out)]) == 2
    (frames / "summary.json").write_text(json.dumps({"rows": 3}))
    assert main(["report", str(out)]) == 2
    shutil.rmtree(frames.parent)

    # A third learner (any packing) joins the same experiment and gets its own table row.
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm-frames"]) == 0
    assert main(["report", str(out)]) == 0
    table = (out / "report" / "table-length-96.md").read_text()
    assert [line.split(" acc. (%)")[0] for line in table.splitlines() if "acc. (%)" in line] == \
        ["| RM", "| CoT", "| rm-frames"]
    # Smoke-sized runs do not reach the plateau: every learner is marked, its OOD cells withheld.
    assert table.count("not fitted (best validation") == 3


def test_iid_experiment_smoke(tmp_path):
    out = tmp_path / "iid"
    assert main(["run", "iid", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]) == 0
    points = json.loads((report(out) / "report.json").read_text())["points"]
    assert [(p["N"], p["learner"]) for p in points] == [(100, "rm"), (200, "rm")]
    assert all(0 <= p["per_token"] <= 1 for p in points)
    # Each run's training is summarised in the training table and drawn as a learning curve.
    table = (out / "report" / "table-training.md").read_text()
    runs = [line.split(" | ")[:3] for line in table.splitlines() if line.startswith("| iid-N")]
    assert runs == [["| iid-N100-s0", "RM", "3"], ["| iid-N200-s0", "RM", "3"]]
    assert all(line.endswith("| max_steps |") for line in table.splitlines() if line.startswith("| iid-N"))
    assert (out / "report" / "curves-iid-N200-s0.png").exists()
    # A run moved out of the folder takes its learning curves out of the report with it.
    shutil.move(out / "iid-N200-s0", tmp_path / "iid-N200-s0-superseded")
    assert sorted(p.name for p in report(out).glob("curves-*")) == ["curves-iid-N100-s0.pdf", "curves-iid-N100-s0.png"]
    shutil.move(tmp_path / "iid-N200-s0-superseded", out / "iid-N200-s0")
    # A size the split cannot supply (like the paper's 450k from its 500k pool) is skipped and said so.
    from rlmlab.experiments.run import run_experiment

    run_experiment("iid", get_preset("smoke").with_overrides(iid_sizes=(100, 200, 9_000)), out, learners=("rm",),
                   progress=False)
    assert json.loads((out / "experiment.json").read_text())["skipped_sizes"]["sizes"] == [9_000]
    assert "Not run: N = 9000" in (report(out) / "table-iid.md").read_text()
    # A split drawn under another trace cap is refused, not silently reused; the cap is reported.
    with pytest.raises(ConfigError, match=r"built with max_trace_len=None \(asked: 60\)"):
        run_experiment("iid", get_preset("smoke").with_overrides(iid_max_trace=60), out, progress=False)
    assert "at most" not in (report(out) / "table-iid.md").read_text()
    capped = tmp_path / "iid-capped"
    run_experiment("iid", get_preset("smoke").with_overrides(iid_max_trace=60), capped, learners=("rm",), sizes=[100],
                   progress=False)
    assert max(pq.read_table(capped / "data" / "iid" / "test.parquet").column("trace_len").to_pylist()) <= 60
    assert "trace has at most 60 tokens" in (report(capped) / "table-iid.md").read_text()

    # Runs on different sizes share a folder; --minutes is the budget of every IID run.
    out = tmp_path / "iid-sizes"
    smoke_iid = ["run", "iid", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]
    assert main([*smoke_iid, "--sizes", "150"]) == 0
    assert main([*smoke_iid, "--sizes", "120,150", "--minutes", "7"]) == 0
    assert json.loads((out / "experiment.json").read_text())["sizes"] == [120, 150]
    assert sorted(p.name for p in out.glob("iid-N*")) == ["iid-N120-s0", "iid-N150-s0"]
    config = json.loads((out / "iid-N120-s0" / "rm" / "config.json").read_text())["train"]
    assert config["max_minutes"] == 7.0 and config["weight_decay"] == 0.0
    for bad in (["--sizes", "1k"], ["--sizes", "0"], ["--sizes", ","]):
        assert main([*smoke_iid, *bad]) == 2
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--sizes", "100"]) == 2
    # --seeds runs a subset of each size's seeds (one full sweep first, the other seeds later);
    # a size with fewer seeds runs those it has, and an index no size has is refused.
    two_seeds = [*smoke_iid, "--preset.iid_seeds=2", "--preset.iid_one_seed_from=150"]
    assert main([*two_seeds, "--sizes", "120,150", "--seeds", "1"]) == 0
    assert sorted(p.name for p in out.glob("iid-N*")) == ["iid-N120-s0", "iid-N120-s1", "iid-N150-s0"]
    assert json.loads((out / "iid-N120-s1" / "rm" / "config.json").read_text())["train"]["seed"] == 1338
    assert '"--seeds=1"' in (out / "commands.jsonl").read_text().splitlines()[-1]
    for bad in (["--seeds", "2"], ["--seeds", "-1"], ["--seeds", "one"], ["--seeds", ","]):
        assert main([*two_seeds, *bad]) == 2
    assert main([*smoke_iid, "--seeds", "1"]) == 2  # the smoke preset runs one seed per size
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--seeds", "0"]) == 2


def test_shortcut_experiment_smoke(tmp_path):
    out = tmp_path / "shortcuts"
    preset = get_preset("smoke").with_overrides(shortcut_max_trace=600,
                                                shortcut_per_learner={"cot": {"train.batch_size": 3}})
    # Two runs on different constructions share the folder (as one process per core would).
    for name in ("position_parity", "copy_deep_return"):
        run_jobs(get_kind("shortcuts").plan(preset, out, ("rm",), constructions=[name], task=PAPER), out, progress=False)
        if name == "copy_deep_return":  # a learner without a run is named, not left as dashes
            table = (report(out) / "table-shortcuts.md").read_text().splitlines()
            column = table[0].split(" | ").index("Not fitted (IID < 99%)")
            assert [line.split(" | ")[column] for line in table[2:4]] == ["RM; no run: CoT", "RM, CoT"]
        run_jobs(get_kind("shortcuts").plan(preset, out, ("rm", "cot"), constructions=[name], task=PAPER), out, progress=False)
        train = pq.read_table(out / "data" / f"shortcut-{name}" / "train.parquet")
        assert max(train.column("trace_len").to_pylist()) <= 600
        # shortcut_per_learner applies to the shortcut runs over the preset's own per-learner settings
        batch = {v: json.loads((out / f"shortcut-{name}" / v / "config.json").read_text())["train"]["batch_size"]
                 for v in ("rm", "cot")}
        assert batch == {"rm": 4, "cot": 3}
    assert json.loads((out / "experiment.json").read_text())["constructions"] == ["copy_deep_return",
                                                                                   "position_parity"]
    rows = json.loads((report(out) / "report.json").read_text())["rows"]
    assert [r["construction"] for r in rows] == ["copy_deep_return", "position_parity"]
    # A smoke model fits nothing, and each row says so next to its shortcut rates.
    table = (out / "report" / "table-shortcuts.md").read_text().splitlines()
    column = table[0].split(" | ").index("Not fitted (IID < 99%)")
    assert [line.split(" | ")[column] for line in table[2:4]] == ["RM, CoT", "RM, CoT"]
    runs = [line.split(" | ")[:2] for line in (out / "report" / "table-training.md").read_text().splitlines()
            if line.startswith("| shortcut-")]
    assert runs == [[f"| shortcut-{name}", learner] for name in ("copy_deep_return", "position_parity")
                    for learner in ("RM", "CoT")]
    curves = out / "report" / "curves-shortcut-position_parity.pdf"
    first = curves.read_bytes()
    report(out)
    assert curves.read_bytes() == first  # a re-run rewrites identical figures (no creation date)
    assert all(0 <= r["cot_shortcut_rate"] <= 1 and r["rm_ood"]["n"] == 6 for r in rows)
    # Probing a learner on a construction's sets adds a column to the shortcut table (IID / OOD
    # positions) and rows to the probe table; a positions-only probe leaves the answer cells empty.
    assert not (report(out) / "table-shortcuts-probe.md").exists()
    for set_name, extra in (("ood", []), ("iid", ["--positions-only"])):
        assert main(["probe", str(out / "shortcut-position_parity" / "cot"), "--data",
                     str(out / "data" / "shortcut-position_parity" / f"{set_name}.parquet"),
                     "--max-new-tokens", "60", *extra]) == 0
    rows = json.loads((report(out) / "report.json").read_text())["rows"]
    assert "cot_probe_ood" not in rows[0] and rows[1]["cot_probe_ood"]["n_expressions"] == 6
    assert "subproblems" not in rows[1]["cot_probe_iid"]
    table = (out / "report" / "table-shortcuts.md").read_text().splitlines()
    assert table[0].endswith("| paper (IID RM/CoT, OOD RM/CoT, rate) | Non-invariant positions IID / OOD, CoT (%) |")
    # Under the table, counts with Wilson intervals per construction and learner.
    ood = rows[1]["cot_ood"]
    # (a smoke model fits nothing, so the rows that carry its OOD numbers say so)
    assert any(line.startswith(f"| position_parity | CoT, not fitted | {rows[1]['cot_iid']['correct']}/6 = ")
               and f"| {ood['correct']}/6 = {100 * ood['accuracy']:.1f} [{100 * ood['ci95'][0]:.1f}, " in line
               for line in table)
    p_iid, p_ood = rows[1]["cot_probe_iid"], rows[1]["cot_probe_ood"]
    assert table[3].endswith(f"| {100 * p_iid['position_rate']:.1f} / {100 * p_ood['position_rate']:.1f} |")
    probe_rows = (out / "report" / "table-shortcuts-probe.md").read_text().splitlines()[2:]
    assert [r.split(" | ")[:3] for r in probe_rows] == [["| position_parity", "CoT, not fitted", "IID"],
                                                        ["| position_parity", "CoT, not fitted", "OOD"]]
    assert probe_rows[0].split(" | ")[6] == "–"  # no answer-level probe on IID
    # Table 3 as the paper lays it out: its row names and order, each learner pair beside the
    # paper's numbers, CoT's probe where it ran, and who did not fit.
    paper = (out / "report" / "table-shortcuts-paper.md").read_text().splitlines()
    assert paper[0].startswith("| Construction, smoke | IID RM / CoT (%) |")
    assert [line.split(" | ")[0] for line in paper[2:]] == ["| copy answer from deep return", "| trace-position parity"]
    parity = paper[3].split(" | ")
    assert parity[2] == f"{100 * rows[1]['rm_ood']['accuracy']:.1f} / {100 * ood['accuracy']:.1f}"
    assert parity[4:] == [f"{100 * p_iid['position_rate']:.1f} / {100 * p_ood['position_rate']:.1f}",
                          "100.0 / 100.0", "99.7 / 9.7", "90.3", "RM, CoT |"]
    assert paper[2].split(" | ")[4] == "–"  # copy_deep_return was not probed
    # A third learner on one construction (CoT without positions) gets a table of its own, one
    # row per learner on that construction only; the paper's two-learner tables stay as they were.
    assert not (out / "report" / "table-shortcuts-learners.md").exists()
    run_jobs(get_kind("shortcuts").plan(preset, out, ("cot@none",), constructions=["position_parity"], task=PAPER), out,
             progress=False)
    report(out)
    assert (out / "report" / "table-shortcuts-paper.md").read_text().splitlines() == paper
    by_learner = (out / "report" / "table-shortcuts-learners.md").read_text().splitlines()
    assert [line.split(" | ")[:2] for line in by_learner[2:]] == [["| position_parity", learner]
                                                                  for learner in ("RM", "CoT", "CoT (NoPE)")]
    # A smoke model fits nothing: its out-of-domain cells are withheld, its probe shown.
    assert by_learner[3].split(" | ")[3:] == ["not fitted"] * 3 + [
        f"{100 * p_iid['position_rate']:.1f} / {100 * p_ood['position_rate']:.1f} |"]
    # A second training seed of RM on one construction adds the table over seeds (the seed-0
    # tables stay as they were): IID over both seeds; out of domain withheld, as no seed fitted.
    assert not (out / "report" / "table-shortcuts-seeds.md").exists()
    run_jobs(get_kind("shortcuts").plan(preset, out, ("rm",), constructions=["position_parity"], seeds=[1], task=PAPER), out,
             progress=False)
    data = json.loads((report(out) / "report.json").read_text())
    assert (out / "report" / "table-shortcuts-paper.md").read_text().splitlines() == paper
    [spread] = data["seeds"]
    assert (spread["construction"], spread["learner"], spread["seeds"], spread["fitted_seeds"]) == (
        "position_parity", "rm", [0, 1], [])
    assert spread["iid"]["per_seed"][0] == rows[1]["rm_iid"]["accuracy"] and spread["ood"] is None
    seeds_table = (out / "report" / "table-shortcuts-seeds.md").read_text().splitlines()
    assert seeds_table[-1].startswith("| position_parity | RM | 0, 1 (0 of 2) | ")
    assert seeds_table[-1].endswith("| not fitted | – | not fitted | – |")


def test_shortcut_learner_table_withholds_unfitted():
    """The per-learner Table 3 shows a fitted learner's out-of-domain accuracy, shortcut rate and
    well-formed share, and withholds them for one below 99% IID; constructions that only the
    paper's two learners ran are left out."""
    from rlmlab.experiments.kinds.shortcuts import shortcut_learner_table

    def a(x):
        return {"accuracy": x}

    rows = [{"construction": "hidden_literal", "rm_iid": a(1.0), "cot_iid": a(0.995)},
            {"construction": "position_parity", "rm_iid": a(0.993), "rm_ood": a(0.993), "rm_shortcut_rate": 0.003,
             "rm_ood_valid": 0.997, "cot_iid": a(0.99), "cot_ood": a(0.167), "cot_shortcut_rate": 0.82,
             "cot_ood_valid": 0.99, "cot_probe_ood": {"position_rate": 0.34},
             "cot@rope_iid": a(0.97), "cot@rope_ood": a(0.5), "cot@rope_shortcut_rate": 0.4, "cot@rope_ood_valid": 1.0}]
    table = shortcut_learner_table(rows, ["rm", "cot", "cot@none", "cot@rope"]).splitlines()
    assert table[2:] == ["| position_parity | RM | 99.3 | 99.3 | 0.3 | 99.7 | – |",
                         "| position_parity | CoT | 99.0 | 16.7 | 82.0 | 99.0 | – / 34.0 |",
                         "| position_parity | CoT (RoPE) | 97.0 | not fitted | not fitted | not fitted | – |"]
    # The probe table shows every probed learner's whole-set accuracy and shortcut rate beside its
    # probe; a learner below 99% IID is marked on each of its rows.
    from rlmlab.experiments.kinds.shortcuts import shortcut_probe_table
    probe = {"n_expressions": 300, "position_rate": 0.3, "position_ci95": [0.29, 0.31]}
    rows[1] |= {"cot_probe_ood": probe, "cot@rope_probe_ood": probe}
    table = shortcut_probe_table(rows, ["cot", "cot@rope"]).splitlines()
    assert [line.split(" | ")[1] for line in table[2:]] == ["CoT", "CoT (RoPE), not fitted"]
    assert table[3].endswith("| 50.0 | 40.0 |")


def test_report_and_run_errors(tmp_path, capsys):
    with pytest.raises(DataError, match="no experiment.json"):
        report(tmp_path)
    assert main(["run", "length", "--preset", "smoke", "--out", str(tmp_path), "--learners", "xx"]) == 2
    assert main(["run", "length", "--preset", "smoke", "--out", str(tmp_path), "--constructions", "x"]) == 2
    assert main(["run", "shortcuts", "--preset", "smoke", "--out", str(tmp_path / "s"),
                 "--constructions", "copy_deep_return,copy_everything"]) == 2
    # An option of another kind is refused before anything is written, naming the kinds that take it.
    assert main(["run", "iid", "--preset", "smoke", "--out", str(tmp_path / "i"), "--threshold", "50"]) == 2
    assert "--threshold applies to `rlmlab run length|depth` only" in capsys.readouterr().err
    assert not (tmp_path / "i").exists()
    from rlmlab.experiments.run import run_experiment

    with pytest.raises(ConfigError, match="sizes: not an option of the shortcuts experiment"):
        run_experiment("shortcuts", "smoke", tmp_path / "s2", sizes=[100])
    with pytest.raises(ConfigError, match="unknown experiment 'recipe'"):
        run_experiment("recipe", "smoke", tmp_path / "r")
    with pytest.raises(ConfigError, match="does not plan recipe experiments"):
        get_kind("recipe").plan(get_preset("smoke"), tmp_path / "r", ("rm",), task=PAPER)


def test_each_job_trains_on_the_run_specification_its_plan_built(tmp_path):
    """The preset builds each job's RunConfig once, when the experiment is planned; the run
    trains on exactly that specification (its config.json), the encoding of a name such as
    `cot@rope` parsed into `model.positions` and the learner's base name."""
    from rlmlab.experiments.run import run_experiment
    from rlmlab.learning.config import RunConfig

    jobs = run_experiment("length", "smoke", tmp_path, learners=("rm", "cot@rope"), progress=False)
    assert [j.learner for j in jobs] == ["rm", "cot@rope"]
    for job in jobs:
        assert isinstance(job.config, RunConfig)
        saved = json.loads((job.run_dir(tmp_path) / "config.json").read_text())
        assert RunConfig.from_dict(saved) == job.config
    rope = jobs[1].config
    assert (rope.data.learner, rope.model.positions) == ("cot", "rope")
    assert rope.data.train == str(tmp_path / "data" / "length-96" / "train.parquet")
    # A learner the config refuses is refused when planned, before a job runs.
    with pytest.raises(ConfigError, match="the encoding after '@' must be one of"):
        run_experiment("length", "smoke", tmp_path / "bad", learners=("cot@nope",), progress=False)


def _iid_train(preset, n: int, learner: str, seed: int = 0):
    """The training settings the preset gives `learner`'s IID run at `n` training expressions."""
    return preset.run_config(learner, "train.parquet", "val.parquet", seed=seed, stage="iid", n=n).train


def test_a_preset_gives_each_stage_its_own_typed_run_specification():
    """`ExperimentPreset.run_config` is the one entry: the stage picks the table over the
    threshold splits' settings, the seed index sets `train.seed`, and a stage or size it does
    not know is a one-line ConfigError."""
    preset = get_preset("paper-cpu")
    split, shortcut = preset.run_config("cot", "t", "v", seed=2), preset.run_config("cot", "t", "v", stage="shortcut")
    assert (split.train.batch_size, shortcut.train.batch_size, split.train.seed) == (16, 8, 1339)
    assert (split.data.learner, split.data.train, split.data.val) == ("cot", "t", "v")
    assert _iid_train(preset, 300, "cot").weight_decay == 0.0 != split.train.weight_decay
    for kw, message in (({"stage": "sweep"}, "unknown stage 'sweep'"), ({"stage": "iid"}, "training-set size"),
                        ({"n": 300}, "training-set size")):
        with pytest.raises(ConfigError, match=message):
            preset.run_config("cot", "t", "v", **kw)


def test_iid_runs_take_the_sweeps_own_budget_and_patience():
    preset = get_preset("smoke").with_overrides(patience=12, iid_patience=5, minutes=150.0, iid_minutes=60.0)
    settings = _iid_train(preset, 100, "rm", seed=2)
    assert (settings.patience, settings.max_minutes) == (5, 60.0)
    assert (settings.weight_decay, settings.seed) == (0.0, 1339)
    # Without sweep-specific values the threshold splits' budget and patience apply.
    settings = _iid_train(dataclasses.replace(preset, iid_patience=None, iid_minutes=None), 100, "rm",
                             seed=0)
    assert ((settings.patience, settings.max_minutes)) == (12, 150.0)
    # Per-learner IID settings apply last; --max-steps replaces every learner's budget.
    preset = get_preset("paper-cpu")
    cot, rm = _iid_train(preset, 300, "cot", seed=0), _iid_train(preset, 300, "rm", seed=0)
    assert (cot.max_steps, rm.max_steps) == (9_000, 3_500)
    assert (cot.batch_size, rm.batch_size) == (16, 256)
    # Both learners train their whole budget, as in the paper's timeout protocol.
    assert (rm.patience, cot.patience) == (None, None) and cot.weight_decay == 0.0
    # Settings per size apply from their size on, the larger threshold over the smaller.
    budget = {n: tuple(_iid_train(preset, n, v, seed=0).max_steps for v in ("rm", "cot"))
              for n in (3_000, 9_999, 10_000, 29_999, 30_000, 100_000)}
    assert budget == {3_000: (3_500, 9_000), 9_999: (3_500, 9_000), 10_000: (7_000, 24_000),
                      29_999: (7_000, 24_000), 30_000: (7_000, 30_000), 100_000: (7_000, 30_000)}
    assert _iid_train(preset, 30_000, "cot", seed=0).eval_every == 500  # the rest is iid_per_learner's
    for n in (300, 30_000):
        assert _iid_train(preset.with_budget(max_steps=7), n, "cot", seed=0).max_steps == 7
        # a wall-clock limit is added beside the step budget, never instead of it
        limited = _iid_train(preset.with_budget(minutes=7.0), n, "cot", seed=0)
        assert (limited.max_minutes, limited.max_steps) == (7.0, {300: 9_000, 30_000: 30_000}[n])
    # A learner without settings of its own takes those of the learner whose driver it decodes with.
    assert _iid_train(preset, 300, "rm-frames", seed=0).max_steps == 3_500
    assert _iid_train(preset, 30_000, "rm-frames", seed=0).max_steps == 7_000
    # --learner-setting edits a size's entry, or adds a size.
    changed = preset.with_learner_settings(["iid_per_size.30000.cot.train.max_steps=40000",
                                            "iid_per_size.1000.rm.train.patience=4"])
    assert _iid_train(changed, 30_000, "cot", seed=0).max_steps == 40_000
    assert _iid_train(changed, 10_000, "cot", seed=0).max_steps == 24_000
    assert [_iid_train(changed, n, "rm", seed=0).patience for n in (300, 1_000)] == [None, 4]


def test_paper_cpu_follows_the_papers_iid_and_shortcut_protocols():
    preset = get_preset("paper-cpu")
    seeds = {n: preset.iid_seeds_at(n) for n in preset.iid_sizes}
    # the paper's sixteen sizes, three seeds up to N = 10,000 and one above
    assert list(seeds) == [100, 200, 300, 500, 1_000, 2_000, 3_000, 5_000, 10_000, 20_000, 30_000, 50_000,
                           100_000, 200_000, 300_000, 450_000]
    assert {n for n, k in seeds.items() if k == 3} == {n for n in seeds if n <= 10_000}
    assert {k for n, k in seeds.items() if n > 10_000} == {1}
    # the step budgets by size band (docs/presets.md, "IID step budgets")
    steps = {v: [_iid_train(preset, n, v).max_steps for n in seeds] for v in ("rm", "cot")}
    assert steps["rm"] == [3_500] * 8 + [7_000] * 8
    assert steps["cot"] == [9_000] * 8 + [24_000] * 2 + [30_000] * 6
    assert preset.iid_pool_n == 1_200_000 and preset.iid_max_trace == 595
    assert (preset.iid_n_test, preset.shortcut_n_eval, preset.shortcut_max_trace) == (5_000, 300, 600)
    shortcut = {v: preset.run_config(v, "t", "v", stage="shortcut").train for v in ("rm", "cot")}
    # the recipe of the threshold splits at its positions per step, with the shortcut runs' own budgets
    assert (shortcut["cot"].lr, shortcut["cot"].batch_size) == (3e-3, 8)
    assert (shortcut["rm"].max_steps, shortcut["cot"].max_steps) == (9_000, 24_000)
    # the plateau comes with the cosine's decay (the recipe probes of docs/recipe.md), so neither stops early
    assert (shortcut["rm"].patience, shortcut["cot"].patience) == (None, None)


def test_run_sets_scalar_preset_fields_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "uncapped"
    argv = ["run", "shortcuts", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm",
            "--constructions", "position_parity"]
    assert main([*argv, "--preset.shortcut_max_trace=900", "--preset.shortcut_n_train", "30"]) == 0
    data = out / "data" / "shortcut-position_parity"
    assert pq.read_metadata(data / "train.parquet").num_rows == 30
    assert json.loads((out / "experiment.json").read_text())["preset"]["shortcut_max_trace"] == 900
    recorded = json.loads((out / "commands.jsonl").read_text().splitlines()[-1])["argv"]
    assert recorded[-2:] == ["--preset.shortcut_max_trace=900", "--preset.shortcut_n_train=30"]
    # The folder's data were built with that cap: a run asking for another is refused.
    capsys.readouterr()
    assert main([*argv, "--preset.shortcut_n_train=30"]) == 2
    assert "max_trace_len" in capsys.readouterr().err
    for bad, message in [("--preset.shortcut_max_trace=lots", "--preset.shortcut_max_trace: expected int"),
                         ("--preset.shortcut_max_trace=0", "shortcut_max_trace must be a positive integer"),
                         ("--preset.iid_max_trace=none", None)]:
        code = main(["run", "iid", "--preset", "smoke", "--out", str(tmp_path / "i"), "--learners", "rm",
                     "--quiet", "--sizes", "100", bad])
        if message is None:
            assert code == 0  # an optional field takes none
        else:
            assert code == 2 and message in capsys.readouterr().err
    # not a scalar field: argparse refuses it, naming it, on one line
    assert main(["run", "iid", "--preset", "smoke", "--out", str(tmp_path / "j"), "--preset.per_learner={}"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --preset.per_learner={}" in err and err.count("\n") == 1


def test_learner_settings_set_one_entry_of_a_per_learner_table():
    preset = get_preset("paper-cpu")
    changed = preset.with_budget(minutes=7.0).with_learner_settings(
        ["shortcut_per_learner.cot.train.batch_size=4", "shortcut_per_learner.cot.train.max_minutes=240",
         "iid_per_learner.rm-frames.train.patience=none"])
    cot = changed.run_config("cot", "t", "v", stage="shortcut").train
    # the entry is set over --minutes and keeps the rest of the learner's settings
    assert (cot.batch_size, cot.max_minutes, cot.lr) == (4, 240.0, 3e-3)
    assert changed.run_config("rm", "t", "v", stage="shortcut").train.max_minutes == 7.0
    # a learner without an entry of its own starts from its driver's
    frames = _iid_train(changed, 300, "rm-frames")
    assert frames.patience is None and frames.eval_every == 300
    assert changed.iid_per_learner["rm"] == preset.with_budget(minutes=7.0).iid_per_learner["rm"]


@pytest.mark.parametrize("item, message", [
    ("shortcut_per_learner.cot.train.batch_size", "expected TABLE.LEARNER.SECTION.KEY=VALUE"),
    ("shortcuts.cot.train.batch_size=4", "unknown table 'shortcuts'"),
    ("per_learner.cott.train.batch_size=4", "cott"),
    ("per_learner.cot.train.batchsize=4", "unknown config key 'train.batchsize'"),
    ("per_learner.cot.train.batch_size=four", "expected int"),
    ("per_learner.cot.train.batch_size=0", "batch_size"),
    ("iid_per_size.lots.cot.train.max_minutes=9", "expected iid_per_size.N.LEARNER.SECTION.KEY=VALUE"),
    ("iid_per_size.0.cot.train.max_minutes=9", "expected iid_per_size.N.LEARNER.SECTION.KEY=VALUE"),
    ("iid_per_size.300.cot.train.max_minutes=-1", "max_minutes"),
])
def test_learner_settings_refuse_bad_entries_on_one_line(tmp_path, capsys, item, message):
    code = main(["run", "iid", "--preset", "smoke", "--out", str(tmp_path / "i"), "--learners", "rm", "--quiet",
                 "--sizes", "100", "--learner-setting", item])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_run_records_and_applies_learner_settings(tmp_path):
    out = tmp_path / "s"
    assert main(["run", "shortcuts", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm",
                 "--constructions", "position_parity",
                 "--learner-setting", "shortcut_per_learner.rm.train.batch_size=2"]) == 0
    saved = json.loads((out / "shortcut-position_parity" / "rm" / "config.json").read_text())
    assert saved["train"]["batch_size"] == 2
    recorded = json.loads((out / "commands.jsonl").read_text().splitlines()[-1])["argv"]
    assert recorded[-1] == "--learner-setting=shortcut_per_learner.rm.train.batch_size=2"


def test_experiment_json_keeps_the_settings_of_every_learners_runs(tmp_path):
    # Two learners run one after the other into one folder, each with its own learning rate; then
    # a second folder reruns one of them with the preset's, and both are exported into one place.
    def run(out, learner, *setting):
        assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", learner,
                     *setting]) == 0

    def table(folder):
        return json.loads((folder / "experiment.json").read_text())["preset"]["per_learner"]

    here, there, results = tmp_path / "here", tmp_path / "there", tmp_path / "results"
    run(here, "rm", "--learner-setting=per_learner.rm.train.lr=0.002")
    run(here, "cot@none", "--learner-setting=per_learner.cot@none.train.lr=0.003")
    assert table(here)["rm"]["train.lr"] == 0.002 and table(here)["cot@none"]["train.lr"] == 0.003
    for learner, lr in (("rm", 0.002), ("cot@none", 0.003)):
        run_dir = here / "length-96" / learner
        assert json.loads((run_dir / "config.json").read_text())["train"]["lr"] == lr
    run(there, "rm")
    assert "train.lr" not in table(there).get("rm", {})
    assert main(["export", str(here), str(results)]) == 0
    assert table(results) == table(here)
    assert main(["export", str(there), str(results)]) == 0
    # rm's runs in results/ are now those of `there`; cot@none's are still those of `here`.
    assert "train.lr" not in table(results)["rm"] and table(results)["cot@none"]["train.lr"] == 0.003


@pytest.mark.parametrize("bad, message", [
    ({"model": "huge"}, "unknown model preset 'huge'"),
    ({"n_val": 0}, "n_val must be a positive integer"),
    ({"minutes": -5.0}, "minutes must be positive"),
    ({"iid_sizes": (300, 100)}, "iid_sizes must be increasing"),
    ({"iid_minutes": 0.0}, "iid_minutes must be positive"),
    ({"iid_max_trace": -1}, "iid_max_trace must be a positive integer"),
    ({"iid_patience": 2.5}, "iid_patience must be a positive integer"),
    ({"eval_runaway_factor": 0}, "eval_runaway_factor must be a positive integer"),
    ({"train": {"lrr": 1e-3}}, "unknown config key 'train.lrr'"),
    ({"per_learner": {"rm": {"train.batch_size": "64"}}}, "train.batch_size: expected int"),
    ({"shortcut_per_learner": {"cot": {"train.batchsize": 32}}}, "unknown config key 'train.batchsize'"),
    ({"iid_per_size": {"10000": {"cot": {"train.max_minutes": 9.0}}}}, "iid_per_size keys must be positive"),
    ({"iid_per_size": {10_000: {"cot": {"train.max_minutes": "long"}}}}, "train.max_minutes: expected"),
])
def test_experiment_presets_are_validated_on_construction(bad, message):
    from rlmlab.errors import ConfigError
    from rlmlab.experiments.presets import ExperimentPreset

    with pytest.raises(ConfigError, match=message):
        ExperimentPreset(**{"name": "t", "model": "tiny", **bad})
    with pytest.raises(ConfigError, match=message):  # overriding a valid preset is checked the same way
        get_preset("smoke").with_overrides(**bad)


@pytest.mark.parametrize("killed_mid_save", [False, True])
def test_an_interrupted_job_is_not_marked_done_and_resumes(tmp_path, monkeypatch, killed_mid_save):
    from contextlib import contextmanager

    import rlmlab.learning.train

    @contextmanager
    def ctrl_c_at_once(echo):  # as if Ctrl-C came during the first step
        yield {"stop": True}

    out = tmp_path / "length"
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]
    run_dir = out / "length-96" / "rm"
    with monkeypatch.context() as m:
        m.setattr(rlmlab.learning.train, "_stop_on_signals", ctrl_c_at_once)
        assert main(argv) == 130
    # `last` was saved after one step, but a half-trained run is neither done nor evaluated.
    assert json.loads((run_dir / "last" / "checkpoint.json").read_text())["step"] == 1
    assert not (run_dir / "done.json").exists() and not (run_dir / "eval").exists()
    if killed_mid_save:  # killed between a save's two renames: only the set-aside copy is whole
        (run_dir / "last").rename(run_dir / ".last.old")
    assert main(argv) == 0  # the re-run resumes it to its budget, then evaluates
    assert json.loads((run_dir / "done.json").read_text())["stop_reason"] == "max_steps"
    assert (run_dir / "eval" / "summary.json").exists()
    # A resume after an interruption is listed as a resume, not as an extended budget.
    from rlmlab.experiments.training_log import training_summary

    assert (training_summary(run_dir)["resumed_at"], training_summary(run_dir)["extended_at"]) == ([1], [])


def test_a_finished_run_evaluates_on_the_threads_the_command_asks_for(tmp_path, monkeypatch):
    # A finished run skips train(), which sets torch's threads; its evaluation must still take
    # the command's, not torch's default of every core (beside another training, many times slower).
    import torch

    import rlmlab.measuring.score

    out = tmp_path / "length"
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm", "--threads", "1"]
    assert main(argv) == 0
    shutil.rmtree(out / "length-96" / "rm" / "eval")  # evaluated again, training skipped
    seen, evaluate = [], rlmlab.measuring.score.evaluate_file
    monkeypatch.setattr(rlmlab.measuring.score, "evaluate_file",
                        lambda *a, **k: (seen.append(torch.get_num_threads()), evaluate(*a, **k))[1])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(argv) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [1]


def test_run_evaluation_shows_a_bar_on_a_terminal_and_none_with_quiet(tmp_path, monkeypatch):
    # The evaluation of a run is its longest silent stage (minutes per learner): on a terminal it
    # reports the expressions decoded out of the set's, as they finish; --quiet keeps it silent.
    import io

    import rlmlab.measuring.score

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = tmp_path / "length"
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--learners", "rm", "--threads", "1"]
    assert main(argv + ["--quiet"]) == 0
    seen, evaluate = [], rlmlab.measuring.score.evaluate_file
    monkeypatch.setattr(rlmlab.measuring.score, "evaluate_file",
                        lambda *a, **k: (seen.append(k.get("progress")), evaluate(*a, **k))[1])
    for quiet in (["--quiet"], []):
        shutil.rmtree(out / "length-96" / "rm" / "eval")  # evaluated again, training skipped
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main(argv + quiet) == 0
        monkeypatch.undo()
        monkeypatch.setattr(rlmlab.measuring.score, "evaluate_file",
                            lambda *a, **k: (seen.append(k.get("progress")), evaluate(*a, **k))[1])
    n = json.loads((out / "length-96" / "rm" / "eval" / "summary.json").read_text())["n"]
    assert seen[0] is None and callable(seen[1])
    assert "eval rm: 100%" in terminal.getvalue() and f"{n}/{n}" in terminal.getvalue()


def test_a_resumable_export_carries_an_unfinished_run_to_another_folder(tmp_path, monkeypatch, capsys):
    from contextlib import contextmanager

    import rlmlab.learning.train

    @contextmanager
    def ctrl_c_at_once(echo):
        yield {"stop": True}

    def argv(out):
        return ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]

    here, there, results = tmp_path / "here", tmp_path / "there", tmp_path / "results"
    assert main(argv(tmp_path / "uninterrupted")) == 0
    with monkeypatch.context() as m:
        m.setattr(rlmlab.learning.train, "_stop_on_signals", ctrl_c_at_once)
        assert main(argv(here)) == 130
    assert main(["export", str(here), str(results)]) == 0  # a plain export carries no weights
    assert not list(results.rglob("*.safetensors"))
    capsys.readouterr()
    assert main(["export", str(here), str(results), "--resumable"]) == 0
    assert "with the `last` checkpoints of 1 unfinished runs, weights only" in capsys.readouterr().out
    carried = results / "length-96" / "rm"
    # Weights and trainer state only: optimizer moments are never carried into results/.
    assert sorted(p.name for p in (carried / "last").iterdir()) == ["checkpoint.json", "model.safetensors"]
    # A plain export now would drop the only copy of the unfinished run's progress: refused, untouched.
    before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    assert main(["export", str(here), str(results)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "length-96/rm" in err and "--resumable" in err
    assert {p: p.read_bytes() for p in results.rglob("*") if p.is_file()} == before
    assert not (carried / "best").exists()  # only what resuming needs
    # On the other machine: the run folder under a fresh --out, then the same command.
    shutil.copytree(carried, there / "length-96" / "rm")
    assert main(argv(there)) == 0
    from rlmlab.experiments.training_log import training_summary, training_table

    summary = training_summary(there / "length-96" / "rm")
    assert summary["resumed_at"] == [1] and summary["restarted_at"] == [1]
    assert "at step 1 (carried without optimizer state: AdamW's moments restarted from zero)" in training_table(
        [{**summary, "job": "length-96", "learner": "rm"}])

    def log(out, kind):
        return [r for r in read_metrics(out / "length-96" / "rm") if r["kind"] == kind]

    # The same steps on the same data (same tokens); from the resume on, the losses differ (fresh
    # moments), which is why the run says so.
    uninterrupted = tmp_path / "uninterrupted"
    ends = [[(r["step"], r["tokens"]) for r in log(out, "end")][-1] for out in (there, uninterrupted)]
    assert ends[0] == ends[1]
    carried_val, plain_val = log(there, "val"), log(uninterrupted, "val")
    assert [r["step"] for r in carried_val] == [r["step"] for r in plain_val] != []
    assert carried_val[-1]["loss"] != plain_val[-1]["loss"]
    # Once the run has finished, exporting it removes the checkpoint that would resume it, and any
    # other an earlier export left beside its results (a `best/` carried by hand, say).
    shutil.copytree(carried / "last", carried / "best")
    assert main(["export", str(there), str(results), "--resumable"]) == 0
    assert not (carried / "best").exists()
    assert (carried / "done.json").exists() and not (carried / "last").exists()
    assert not list(results.rglob("*.safetensors"))


def test_a_run_trained_but_not_evaluated_is_not_exported_without_its_weights(tmp_path, capsys):
    """`run_job` writes done.json when training ends and evaluates after it: a run stopped in
    between has no results yet, and its `best` checkpoint is the only way to get them. A plain
    export leaves it out; a resumable one carries `best` (weights only), from which the same
    command evaluates it on another machine."""
    def argv(out):
        return ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]

    here, results, there = tmp_path / "here", tmp_path / "results", tmp_path / "there"
    assert main(argv(here)) == 0
    run = here / "length-96" / "rm"
    shutil.rmtree(run / "eval")  # stopped after training, before its evaluation
    assert (run / "done.json").exists()
    assert main(["export", str(here), str(results)]) == 0
    assert "left out 1 unfinished run(s)" in capsys.readouterr().err
    assert not (results / "length-96" / "rm").exists()
    assert main(["export", str(here), str(results), "--resumable"]) == 0
    carried = results / "length-96" / "rm"
    assert sorted(p.name for p in (carried / "best").iterdir()) == ["checkpoint.json", "model.safetensors"]
    assert not (carried / "last").exists()
    # A plain export now would drop the only copy of the weights that evaluate it: refused.
    assert main(["export", str(here), str(results)]) == 2
    assert "length-96/rm" in capsys.readouterr().err
    shutil.copytree(carried, there / "length-96" / "rm")
    assert main(argv(there)) == 0  # evaluates, does not train again
    assert any((there / "length-96" / "rm" / "eval").rglob("summary.json"))
    assert main(["export", str(there), str(results)]) == 0  # evaluated now: its weights leave results/
    assert not list(results.rglob("*.safetensors"))


@pytest.mark.parametrize("kind, extra, job", [
    ("length", [], "length-96"),
    ("iid", ["--sizes", "100"], "iid-N100-s0"),
    ("shortcuts", ["--constructions", "position_parity"], "shortcut-position_parity"),
])
def test_an_exported_folder_copied_back_runs_again_on_its_rebuilt_data(tmp_path, capsys, kind, extra, job):
    # An export keeps each data set's JSON and leaves its parquet files out; copied back whole as a
    # run folder (say, to add a learner beside the exported ones), it rebuilds the same data.
    def argv(out):
        return ["run", kind, "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm", *extra]

    first, results, again = tmp_path / "first", tmp_path / "results", tmp_path / "again"
    assert main(argv(first)) == 0
    assert main(["export", str(first), str(results)]) == 0
    data = results / "data" / (job if kind != "iid" else "iid")
    assert sorted(p.suffix for p in data.iterdir()) == [".json"]
    shutil.copytree(results, again)
    if kind == "shortcuts":  # a record written when the checks' details were worded otherwise
        record = again / data.relative_to(results) / "shortcut.json"
        doc = json.loads(record.read_text())
        for check in doc["params"]["validity"]["checks"]:
            check["detail"] = "worded by an older version"
        record.write_text(json.dumps(doc))
    summary = again / job / "rm" / "eval"
    stamps = {p: p.stat().st_mtime_ns for p in summary.rglob("summary.json")}
    assert stamps and main(argv(again)) == 0
    assert {p: p.stat().st_mtime_ns for p in summary.rglob("summary.json")} == stamps  # nothing re-ran
    for table in (first / data.relative_to(results)).glob("*.parquet"):
        assert pq.read_table(again / table.relative_to(first)).equals(pq.read_table(table)), table.name

    # Data whose JSON records other parameters are refused on one line, and nothing is rebuilt.
    meta_file = next(data.glob("*.json"))
    doc = json.loads(meta_file.read_text())
    key = "n_val" if "n_val" in doc["params"] else next(iter(doc["params"]))
    doc["params"][key] = 123456
    tampered = tmp_path / "tampered"
    shutil.copytree(results, tampered)
    (tampered / meta_file.relative_to(results)).write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(argv(tampered)) == 2
    err = capsys.readouterr().err
    assert f"differ from what {meta_file.name} records ({key})" in err and err.count("\n") == 1
    assert not list((tampered / meta_file.relative_to(results)).parent.glob("*.parquet"))


def test_extend_continues_a_run_that_ran_out_of_budget(tmp_path, capsys):
    out = tmp_path / "length"
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]
    run_dir = out / "length-96" / "rm"
    assert main(argv) == 0
    first = read_results(run_dir / "eval")
    assert json.loads((run_dir / "done.json").read_text())["step"] == 3  # smoke: max_steps 3
    assert main([*argv, "--max-steps", "5"]) == 0  # without --extend a finished run is skipped
    assert json.loads((run_dir / "done.json").read_text())["step"] == 3
    assert main([*argv, "--max-steps", "5", "--extend"]) == 0
    done = json.loads((run_dir / "done.json").read_text())
    assert (done["step"], done["stop_reason"]) == (5, "max_steps")
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if r["kind"] == "end"] == [3, 5]  # one log, continued past the old end
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)
    # The old outputs describe the old model: kept aside, and the evaluation is redone.
    old = run_dir / "superseded-step3"
    assert json.loads((old / "done.json").read_text())["step"] == 3
    assert read_results(old / "eval") == first
    assert json.loads((run_dir / "eval" / "summary.json").read_text())["step"] <= 5
    assert main(["report", str(out)]) == 0
    # The report marks the extension, where the learning rate restarted, apart from plain resumes.
    assert "- length-96 RM: at step 3 (budget extended)\n" in (out / "report" / "table-training.md").read_text()
    capsys.readouterr()
    # Nothing to extend to: the run stays finished and says why.
    assert main([*argv, "--max-steps", "5", "--extend"]) == 0
    assert "not extended: it ran out of max_steps=5" in capsys.readouterr().err
    assert json.loads((run_dir / "done.json").read_text())["step"] == 5
    assert json.loads((out / "commands.jsonl").read_text().splitlines()[-1])["argv"][-1] == "--extend"


def test_extend_lifts_the_early_stop_of_a_run_that_stopped_on_its_plateau(tmp_path, capsys):
    out = tmp_path / "length"
    # min_delta 10 counts no validation after the first as an improvement: a plateau stop at the
    # second validation (step 4), well inside the step budget.
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm", "--max-steps", "12",
            "--learner-setting", "per_learner.rm.train.min_delta=10"]
    run_dir = out / "length-96" / "rm"
    assert main([*argv, "--preset.patience=1"]) == 0
    assert json.loads((run_dir / "done.json").read_text())["stop_reason"] == "plateau"
    assert json.loads((run_dir / "done.json").read_text())["step"] == 4
    capsys.readouterr()
    assert main([*argv, "--preset.patience=1", "--extend"]) == 0
    assert "not extended: it stopped on patience=1 and the patience asked for now is 1" in capsys.readouterr().err
    assert main([*argv, "--preset.patience=2", "--extend"]) == 0
    done = json.loads((run_dir / "done.json").read_text())
    assert (done["step"], done["stop_reason"]) == (6, "plateau")  # one more stalled validation allowed
    assert json.loads((run_dir / "superseded-step4" / "done.json").read_text())["step"] == 4
    assert json.loads((run_dir / "eval" / "summary.json").read_text())["step"] <= 6
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if r["kind"] in ("end", "resume")] == [4, 4, 6]
    assert main(["report", str(out)]) == 0
    table = (out / "report" / "table-training.md").read_text()
    assert "- length-96 RM: at step 4 (after a plateau stop, with a larger patience)\n" in table
    assert "budget extended" not in table  # its schedule did not restart


@pytest.mark.parametrize("config", ['{"train": 3}', '{"train": {"patience": "5"}}', '{"train": {"max_minutes": [1]}}',
                                    '{"data": {}}', '[]', '{"train": '])
def test_extend_refuses_a_damaged_config_with_one_line(tmp_path, config):
    from rlmlab.experiments.run_job import reopen_to_extend
    from rlmlab.learning.config import TrainConfig

    (tmp_path / "done.json").write_text('{"step": 4, "stop_reason": "plateau"}')
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(DataError, match="done.json or config.json is not what `rlmlab run` writes"):
        reopen_to_extend(tmp_path, TrainConfig(patience=None, max_minutes=9))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["config.json", "done.json"]  # nothing moved


def test_export_of_a_reopened_run_drops_its_earlier_export_outputs(tmp_path, capsys):
    from rlmlab.experiments.run_job import reopen_to_extend
    from rlmlab.learning.config import TrainConfig

    out, dest = tmp_path / "length", tmp_path / "results" / "length"
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    run_dir, exported = out / "length-96" / "rm", dest / "length-96" / "rm"
    (run_dir / "probe" / "eval").mkdir(parents=True)  # as `rlmlab probe` of the first end would leave
    (run_dir / "probe" / "eval" / "summary.json").write_text('{"groups": []}')
    assert main(["export", str(out), str(dest)]) == 0
    assert (exported / "done.json").exists() and has_results(exported / "eval")
    # Extended and still training at the next export: the run is left out, its earlier export stays.
    assert reopen_to_extend(run_dir, TrainConfig(max_steps=5)) is None
    capsys.readouterr()
    assert main(["export", str(out), str(dest)]) == 0
    assert "left out 1 unfinished run(s) and the commands that planned only them: length-96/rm" in capsys.readouterr().err
    assert json.loads((exported / "done.json").read_text())["step"] == 3 and (exported / "probe").exists()
    assert not (exported / "superseded-step3").exists()
    # Finished at its new budget: the new end replaces the old, and what it has not redone is dropped.
    assert main([*argv, "--learners", "rm", "--max-steps", "5", "--extend"]) == 0
    assert main(["export", str(out), str(dest)]) == 0
    assert json.loads((exported / "done.json").read_text())["step"] == 5 and has_results(exported / "eval")
    assert json.loads((exported / "superseded-step3" / "done.json").read_text())["step"] == 3
    assert not (exported / "probe").exists() and (exported / "superseded-step3" / "probe").exists()
    assert (dest / "length-96" / "cot" / "done.json").exists()  # the other learner's run is untouched
    assert not list(dest.rglob(".lock")) and list(out.rglob(".lock"))  # lock files stay behind


def test_export_leaves_out_runs_in_flight_and_the_commands_that_planned_only_them(tmp_path, monkeypatch, capsys):
    from contextlib import contextmanager

    import rlmlab.learning.train
    from rlmlab.experiments.reproduce import stored_commands

    @contextmanager
    def ctrl_c_at_once(echo):
        yield {"stop": True}

    out, dest = tmp_path / "length", tmp_path / "results"
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet"]
    assert main([*argv, "--learners", "rm"]) == 0
    with monkeypatch.context() as m:  # CoT interrupted: in flight, as a training beside the export would be
        m.setattr(rlmlab.learning.train, "_stop_on_signals", ctrl_c_at_once)
        assert main([*argv, "--learners", "cot"]) == 130
    assert [json.loads(line)["runs"] for line in (out / "commands.jsonl").read_text().splitlines()] == [
        ["length-96/rm"], ["length-96/cot"]]
    assert main(["export", str(out), str(dest)]) == 0
    assert "left out 1 unfinished run(s)" in capsys.readouterr().err
    assert (dest / "length-96" / "rm" / "done.json").exists() and not (dest / "length-96" / "cot").exists()
    assert [a[a.index("--learners=rm") if "--learners=rm" in a else -1] for a in stored_commands(dest)] == [
        "--learners=rm"]  # `rlmlab reproduce` re-runs the finished run's command only
    report = (dest / "report" / "table-length-96.md").read_text()
    assert "RM" in report and "CoT" not in report
    # Once CoT finishes, the next export brings it and its command.
    assert main([*argv, "--learners", "cot"]) == 0
    assert main(["export", str(out), str(dest)]) == 0
    assert "left out" not in capsys.readouterr().err
    assert (dest / "length-96" / "cot" / "done.json").exists()
    assert [json.loads(line)["runs"] for line in (dest / "commands.jsonl").read_text().splitlines()] == [
        ["length-96/rm"], ["length-96/cot"], ["length-96/cot"]]


def test_a_run_held_by_another_process_is_refused_and_planning_waits_its_turn(tmp_path, capsys):
    import threading

    from rlmlab.experiments.folder import folder_lock

    out = tmp_path / "length"
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]
    with folder_lock(out / "length-96" / "rm"):  # as another `rlmlab run` training it would
        assert main(argv) == 2
    assert "length-96/rm: another process is training or evaluating this run" in capsys.readouterr().err
    assert not (out / "commands.jsonl").exists()  # a refused command is not recorded
    assert not (out / "length-96" / "rm" / "done.json").exists()
    assert main(argv) == 0  # released: the run trains
    # A run that finds another planning in the folder waits for it, then plans on what it built.
    planned = threading.Event()

    def second_run():
        assert main([*argv, "--learners", "cot"]) == 0
        planned.set()

    with folder_lock(out):
        thread = threading.Thread(target=second_run)
        thread.start()
        assert not planned.wait(10.0)  # time for the thread to reach the lock, even on a loaded machine
    thread.join(120)
    assert planned.is_set() and (out / "length-96" / "cot" / "done.json").exists()
    assert "another run is building data or recording its plan here; waiting for it" in capsys.readouterr().err


def test_export_merges_runs_of_one_experiment_from_several_folders(tmp_path):
    # Two machines (or sessions) each ran a part of the sweep into a folder of their own.
    parts = {n: tmp_path / f"part-{n}" for n in (100, 200)}
    for n, out in parts.items():
        assert main(["run", "iid", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm",
                     "--sizes", str(n)]) == 0
    dest = tmp_path / "results" / "iid"
    for out in parts.values():
        assert main(["export", str(out), str(dest)]) == 0
    assert json.loads((dest / "experiment.json").read_text())["sizes"] == [100, 200]
    points = json.loads((dest / "report" / "report.json").read_text())["points"]
    assert [(p["N"], p["learner"]) for p in points] == [(100, "rm"), (200, "rm")]
    history = (dest / "commands.jsonl").read_text().splitlines()
    assert history == (parts[100] / "commands.jsonl").read_text().splitlines() + \
        (parts[200] / "commands.jsonl").read_text().splitlines()
    # Re-exporting a folder after another command on it adds that command only.
    assert main(["run", "iid", "--preset", "smoke", "--out", str(parts[200]), "--quiet", "--learners", "rm",
                 "--sizes", "200"]) == 0
    assert main(["export", str(parts[200]), str(dest)]) == 0
    assert (dest / "commands.jsonl").read_text().splitlines() == history + history[-1:]
    # So does re-exporting the first folder, whose history is no longer the end of the merged one.
    assert main(["run", "iid", "--preset", "smoke", "--out", str(parts[100]), "--quiet", "--learners", "rm",
                 "--sizes", "100"]) == 0
    assert main(["export", str(parts[100]), str(dest)]) == 0
    first = (parts[100] / "commands.jsonl").read_text().splitlines()
    assert (dest / "commands.jsonl").read_text().splitlines() == history + history[-1:] + first[-1:]
    # Another experiment's results are refused, not mixed in.
    length = tmp_path / "length"
    assert main(["run", "length", "--preset", "smoke", "--out", str(length), "--quiet", "--learners", "rm"]) == 0
    assert main(["export", str(length), str(dest)]) == 2
    assert json.loads((dest / "experiment.json").read_text())["kind"] == "iid"


def test_paper_cpu_preset_builds_the_papers_splits(tmp_path):
    """The CPU preset at the paper's thresholds: L = 595 and K = 10, the paper's fixed multiplier
    bins, 310 evaluation expressions per bin (on a small pool here, so the far bins run short)."""
    from rlmlab.experiments.splits import Split

    preset = get_preset("paper-cpu").with_overrides(pool_n=6_000)
    assert (preset.length, preset.depth, preset.per_bin_cap) == (595, 10, 310)
    length = get_kind("length").plan(preset, tmp_path / "length", ("rm", "cot"), task=PAPER)
    depth = get_kind("depth").plan(preset, tmp_path / "depth", ("rm", "cot"), task=PAPER)
    assert [j.learner for j in length] == ["rm", "cot"] and [j.name for j in depth] == ["depth-10"] * 2
    for kind, labels, edges in [
        ("length-595", ["<=0.25", "0.25-0.5", "0.5-1.0", "1.0-1.25", "1.25-1.5", "1.5-2.0", "2.0-2.5", "2.5-3.0",
                        "3.0-5.0", ">5.0"], [0, 0.25, 0.5, 1, 1.25, 1.5, 2, 2.5, 3, 5]),
        ("depth-10", ["<=0.3", "0.4-0.6", "0.7-1.0", "1.1", "1.2-1.3", "1.4-1.5", "1.6-1.7", "1.8-1.9", "2.0-2.1",
                      ">=2.2"], [0, 0.35, 0.65, 1, 1.15, 1.35, 1.55, 1.75, 1.95, 2.15]),
    ]:
        split = Split.load(tmp_path / kind.split("-")[0] / "data" / kind, task=PAPER)
        threshold = split.params["threshold"]
        bins = split.params["bins"]
        assert [b["label"] for b in bins] == labels
        assert [float(Fraction(b["lo"])) for b in bins] == edges
        assert [b["ood"] for b in bins] == [False] * 3 + [True] * 7
        assert all(b["sampled"] == min(310, b["available"]) for b in bins)
        ev = split.eval.to_pylist()
        column = "trace_len" if kind.startswith("length") else "max_depth"
        for row in ev:  # every evaluation expression sits in its bin's multiplier range of the threshold
            b = bins[row["bin_index"]]
            ratio = row[column] / threshold
            assert ratio > float(Fraction(b["lo"])) or (ratio == 0 == float(Fraction(b["lo"])))
            assert b["hi"] is None or ratio <= float(Fraction(b["hi"]))
        assert max(r[column] for r in split.train.to_pylist()) <= threshold


@pytest.mark.parametrize("name", sorted(EXPERIMENT_PRESETS))
def test_every_preset_budgets_every_run_in_steps(name):
    """A schedule is a function of the step alone: every learner of every experiment of every
    preset has a step budget (its cosine's horizon) and no wall-clock budget."""
    preset = get_preset(name)
    for learner in ("rm", "cot", "rm-frames"):
        runs = [preset.run_config(learner, "t", "v").train, preset.run_config(learner, "t", "v", stage="shortcut").train]
        runs += [_iid_train(preset, n, learner) for n in preset.iid_sizes]
        for train in runs:
            assert train.max_steps is not None and train.max_steps >= 1 and train.max_minutes is None


def test_run_budget_flags_override_every_learners_own_budget():
    preset = get_preset("paper-cpu")
    assert {v: s["train.max_steps"] for v, s in preset.per_learner.items()} == {"rm": 6_000, "cot": 24_000}
    both = preset.with_budget(max_steps=5)
    assert both.max_steps == both.iid_max_steps == 5
    assert all("train.max_steps" not in s for s in both.per_learner.values())
    assert all(both.run_config(v, "t", "v").train.max_steps == 5 for v in ("rm", "cot"))
    assert both.per_learner["cot"]["train.batch_size"] == preset.per_learner["cot"]["train.batch_size"]
    assert preset.with_budget() == preset


def test_paper_cpu_cot_decays_to_a_hundredth_on_the_splits_and_shortcuts_only():
    """The splits' CoT horizon (24,000 steps to 1% of the peak rate, docs/recipe.md) is the
    shortcut runs' too, where the recipe probes fitted with it; the IID runs keep the schedule
    their committed results were trained with."""
    from rlmlab.learning.config import TrainConfig

    preset = get_preset("paper-cpu")
    split = preset.run_config("cot", "t", "v").train
    assert (split.max_steps, split.min_lr_ratio) == (24_000, 0.01)
    assert preset.run_config("cot@rope", "t", "v").train.min_lr_ratio == 0.01
    shortcut = preset.run_config("cot", "t", "v", stage="shortcut").train
    assert (shortcut.max_steps, shortcut.min_lr_ratio) == (24_000, 0.01)
    for n in preset.iid_sizes:
        assert _iid_train(preset, n, "cot").min_lr_ratio == 0.1
    assert preset.run_config("rm", "t", "v").train.min_lr_ratio == TrainConfig().min_lr_ratio


def test_job_folders_are_named_by_their_kind_and_read_back(tmp_path):
    iid = get_kind("iid")
    for n, seed in [(30_000, 2), (300, 0)]:
        (tmp_path / iid.job_name(n, seed)).mkdir()
    (tmp_path / "iid-N12-sx").mkdir()  # a stray folder with a similar name is not a run
    assert iid.job_names(tmp_path, {"sizes": [300]}) == ["iid-N300-s0", "iid-N30000-s2"]
    assert get_kind("depth").job_names(tmp_path, {"threshold": 10}) == ["depth-10"]
    assert get_kind("shortcuts").job_names(tmp_path, {"constructions": ["position_parity"]}) == \
        ["shortcut-position_parity"]
    # What makes two folders the same experiment: kind, preset, pool and task (a folder from
    # before tasks were recorded holds the paper's); the threshold matters for the splits only.
    from rlmlab.task.taskfile import load_task, paper_task

    paper = paper_task().digest
    preset = {"name": "small", "pool_n": 500_000, "pool_seed": 42, "minutes": 5.0}
    same = {"preset": "small", "pool": [500_000, 42], "task": paper}
    assert get_kind("length").identity({"kind": "length", "threshold": 595, "sizes": [1], "preset": preset}) == \
        {"kind": "length", "threshold": 595, **same}
    assert get_kind("iid").identity({"kind": "iid", "sizes": [1], "preset": preset}) == {"kind": "iid", **same}
    assert get_kind("iid").identity({"kind": "iid", "preset": preset, "task": load_task("mod7").identity}) == \
        {"kind": "iid", **same, "task": load_task("mod7").digest}


def test_a_learner_with_another_position_encoding_runs_beside_the_papers(tmp_path):
    """`--learners cot@rope`: its own run folder, trained on the cot learner with model.positions=rope,
    refused as a checkpoint of another encoding, and labelled CoT (RoPE) in the split's table,
    the training table and the viewer."""
    from rlmlab.learning.checkpoint import load_run

    out = tmp_path / "length"
    # One expression per bin: an untrained table-free CoT decodes every row to the runaway cap.
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "cot,cot@rope",
                 "--preset.per_bin_cap=1",
                 "--learner-setting", "per_learner.cot@rope.train.lr=3e-3"]) == 0
    run = out / "length-96" / "cot@rope"
    config = json.loads((run / "config.json").read_text())
    assert (config["data"]["learner"], config["model"]["positions"], config["train"]["lr"]) == ("cot", "rope", 3e-3)
    assert json.loads((out / "length-96" / "cot" / "config.json").read_text())["model"]["positions"] == "learned"
    assert load_run(run).model.cfg.positions == "rope" and load_run(run).model.wpe is None
    with pytest.raises(Exception, match="trained with model.positions=rope, not learned"):
        load_run(run, encoding="learned")
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert summary["learner"] == "cot@rope" and "view" not in summary
    assert main(["report", str(out)]) == 0
    table = (out / "report" / "table-length-96.md").read_text()
    assert [line.split(" acc. (%)")[0] for line in table.splitlines() if "acc. (%)" in line] == \
        ["| CoT", "| CoT (RoPE)"]
    assert "| length-96 | CoT (RoPE) |" in (out / "report" / "table-training.md").read_text()
    assert main(["view", str(out), "--out", str(tmp_path / "html"), "--quiet"]) == 0
    assert "CoT (RoPE)" in (tmp_path / "html" / "index.html").read_text()
    assert "learner <b>CoT (RoPE)</b>" in (tmp_path / "html" / "length-96" / "cot@rope" / "eval.html").read_text()
    # An unknown encoding is a one-line error before anything runs.
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "cot@sinusoid"]) == 2

"""Old names still load: a learner was once a "view" (`data.view`, the preset tables `per_view`,
`shortcut_per_view`, `iid_per_view`, `"view"` in checkpoints, summaries and reports). Everything
saved or typed under those names reads as it did; giving an old name and its new one at once is
refused on one line (docs/cli.md, "Old names, still accepted")."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import one_line_error

from rlmlab.cli import main
from rlmlab.errors import CheckpointError, ConfigError, DataError
from rlmlab.learning import checkpoint as ck
from rlmlab.learning.config import RunConfig, apply_overrides, apply_settings, load_config_file
from rlmlab.runlog import read_metrics
from rlmlab.task.pool import build_pool, write_pool
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

ROOT = Path(__file__).resolve().parent.parent
RELEASED = ROOT / "rlmlab" / "released" / "paper-cpu-length-595"
RESULTS = ROOT / "results"


def to_old_checkpoint(ckpt: Path) -> None:
    """Rewrite a checkpoint as format /2 wrote it ("view", `data.view` in its run config), sealed
    with its digest as that format sealed it."""
    meta = json.loads((ckpt / "checkpoint.json").read_text())
    meta["format"] = ck.VIEW_FORMAT
    meta["view"] = meta.pop("learner")
    meta["config"]["data"]["view"] = meta["config"]["data"].pop("learner")
    meta["digest"] = ck.meta_digest(meta)
    (ckpt / "checkpoint.json").write_text(json.dumps(meta, indent=1))


def to_old_config(path: Path) -> None:
    cfg = json.loads(path.read_text())
    cfg["data"]["view"] = cfg["data"].pop("learner")
    path.write_text(json.dumps(cfg, indent=1) + "\n")


# --- the config key data.view ----------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_config_file_with_data_view_loads_as_data_learner(tmp_path, suffix):
    path = tmp_path / f"c{suffix}"
    path.write_text(json.dumps({"data": {"view": "cot", "row_len": 64}}) if suffix == ".json"
                    else '[data]\nview = "cot"\nrow_len = 64\n')
    cfg = load_config_file(path)
    assert cfg.data.learner == "cot" and cfg.data.row_len == 64
    (tmp_path / "new.json").write_text(json.dumps({"data": {"learner": "cot", "row_len": 64}}))
    assert cfg == load_config_file(tmp_path / "new.json")
    assert "view" not in cfg.to_dict()["data"] and cfg.to_dict()["data"]["learner"] == "cot"


def test_the_old_key_in_overrides_and_settings():
    assert apply_overrides(RunConfig(), ["data.view=window:64"]).data.learner == "window:64"
    assert apply_overrides(RunConfig(), {"data.view": "cot"}) == apply_overrides(RunConfig(), {"data.learner": "cot"})
    assert apply_settings(RunConfig(), {"data.view": "reduce"}).data.learner == "reduce"
    # A bad value under the old name is reported under the new one.
    with pytest.raises(ConfigError, match="data.learner: unknown learner 'nope'"):
        apply_overrides(RunConfig(), ["data.view=nope"])
    with pytest.raises(ConfigError, match="data.learner=cot and model.positions=rope"):
        apply_overrides(RunConfig(), ["data.view=cot@rope"])


@pytest.mark.parametrize("both", [["data.view=cot", "data.learner=cot"], ["data.learner=rm", "data.view=cot"]])
def test_both_names_of_the_key_are_refused(both):
    with pytest.raises(ConfigError, match="'data.view' is the old name of 'data.learner'; give one of them"):
        apply_overrides(RunConfig(), both)
    with pytest.raises(ConfigError, match="old name"):
        RunConfig.from_dict({"data": {"view": "cot", "learner": "cot"}})
    with pytest.raises(ConfigError, match="old name"):
        apply_settings(RunConfig(), {"data.view": "cot", "data.learner": "rm"})


def test_both_names_on_the_command_line_or_in_a_file_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "e.parquet").write_bytes(b"")
    err = one_line_error(capsys, ["train", "--data.view=cot", "--data.learner=rm", "--data", str(tmp_path / "e.parquet"),
                                  "--out", str(tmp_path / "r"), "--max-steps", "1"])
    assert "old name of 'data.learner'" in err
    (tmp_path / "c.json").write_text(json.dumps({"data": {"view": "cot", "learner": "cot"}}))
    err = one_line_error(capsys, ["train", "--config", str(tmp_path / "c.json"), "--data", str(tmp_path / "e.parquet"),
                                  "--out", str(tmp_path / "r"), "--max-steps", "1"])
    assert "old name of 'data.learner'" in err and not (tmp_path / "r").exists()


def test_a_run_saved_under_the_old_names_resumes_and_is_saved_under_the_new(tmp_path, capsys, monkeypatch):
    """A run in progress when the names changed (config.json with data.view, checkpoints of format
    /2 with "view") resumes under the new code, at its step, and its next checkpoint is format /3."""
    import rlmlab.measuring.score

    monkeypatch.setattr(rlmlab.measuring.score, "answer_accuracy_fn",
                        lambda exprs, **kw: lambda model, vocab, learner: {"answer_acc": 0.5, "answer_valid": 1.0})
    pool = tmp_path / "pool.parquet"
    write_pool(build_pool(120, 5, workers=1, task=PAPER), pool)
    out = tmp_path / "run"
    assert main(["train", "--data.view=cot", "--preset", "tiny", "--data", str(pool), "--out", str(out),
                 "--max-steps", "2", "--data.val_size=20", "--data.cache_dir=", "--train.eval_every=2",
                 "--train.warmup_steps=1", "--train.batch_size=4", "--train.answer_eval=2", "--quiet"]) == 0
    assert json.loads((out / "config.json").read_text())["data"]["learner"] == "cot"
    for which in ("last", "best"):
        to_old_checkpoint(out / which)
    to_old_config(out / "config.json")
    old = ck.read_checkpoint_meta(out / "last")
    assert old["format"] == "rlmlab-checkpoint/2" and old["learner"] == "cot" and "view" not in old
    assert main(["train", "--out", str(out), "--resume", "--max-steps", "4", "--quiet"]) == 0
    resumed = ck.load_run(out, "last")
    assert (resumed.learner, resumed.step) == ("cot", 4)
    saved = json.loads((out / "last" / "checkpoint.json").read_text())
    assert saved["format"] == ck.FORMAT == "rlmlab-checkpoint/3" and saved["learner"] == "cot" and "view" not in saved
    assert saved["config"]["data"]["learner"] == "cot"
    assert json.loads((out / "config.json").read_text())["data"]["learner"] == "cot"


# --- checkpoints ------------------------------------------------------------------------------

def test_the_released_checkpoints_load_unchanged_under_format_2():
    for name in ("rm", "cot"):
        raw = (RELEASED / name / "best" / "checkpoint.json").read_bytes()
        meta = json.loads(raw)
        assert meta["format"] == "rlmlab-checkpoint/2" and meta["view"] == name and "learner" not in meta
        run = ck.load_run(RELEASED / name)
        assert run.learner == name and run.step == meta["step"]
        assert (RELEASED / name / "best" / "checkpoint.json").read_bytes() == raw  # read, never rewritten


def test_each_format_names_the_learner_its_own_way(tmp_path):
    run = tmp_path / "rm"
    shutil.copytree(RELEASED / "rm", run)
    path = run / "best" / "checkpoint.json"
    meta = json.loads(path.read_text())
    # Format /2 with the new name, or /3 with the old one, is neither format: refused even resealed.
    for fmt, key in ((ck.VIEW_FORMAT, "learner"), (ck.FORMAT, "view")):
        forged = {k: v for k, v in meta.items() if k != "view"} | {"format": fmt, key: "rm"}
        forged["digest"] = ck.meta_digest(forged)
        path.write_text(json.dumps(forged))
        with pytest.raises(CheckpointError, match="learner"):
            ck.load_run(run)
    # The same checkpoint written as /3 loads, with the same weights and step.
    new = {k: v for k, v in meta.items() if k != "view"} | {"format": ck.FORMAT, "learner": "rm"}
    new["digest"] = ck.meta_digest(new)
    path.write_text(json.dumps(new))
    assert (ck.load_run(run).learner, ck.load_run(run).step) == ("rm", meta["step"])


# --- experiment presets -----------------------------------------------------------------------

def test_old_table_names_in_learner_settings_set_the_same_entries():
    from rlmlab.experiments.presets import get_preset

    p = get_preset("paper-cpu")
    for old, new in (("per_view", "per_learner"), ("shortcut_per_view", "shortcut_per_learner"),
                     ("iid_per_view", "iid_per_learner")):
        a = p.with_learner_settings([f"{old}.cot.train.max_steps=24000", f"{old}.rm-frames.train.lr=3e-4"])
        b = p.with_learner_settings([f"{new}.cot.train.max_steps=24000", f"{new}.rm-frames.train.lr=3e-4"])
        assert a == b and getattr(a, new)["cot"]["train.max_steps"] == 24000
        assert getattr(a, new)["rm-frames"]["train.lr"] == 3e-4


def test_the_stored_command_of_the_running_cot24k_experiment_still_parses():
    """`rlmlab run ... --learner-setting per_view.cot.train.max_steps=24000`, as commands.jsonl
    files store it, sets the same budget as the new spelling."""
    from rlmlab.cli import build_parser
    from rlmlab.experiments.presets import get_preset

    argv = ["run", "length", "--preset", "paper-cpu", "--out", "runs/length-595-cot24k", "--views=rm,cot",
            "--learner-setting=per_view.cot.train.max_steps=24000",
            "--learner-setting=per_view.cot.train.min_lr_ratio=0.01"]
    args = build_parser().parse_args(argv)
    assert args.learners == "rm,cot"
    p = get_preset("paper-cpu").with_learner_settings(args.learner_setting)
    cot = p.run_config("cot", "t", "v").train
    assert (cot.max_steps, cot.min_lr_ratio) == (24000, 0.01)
    assert p.run_config("rm", "t", "v") == get_preset("paper-cpu").run_config("rm", "t", "v")
    # those two values are the preset's own since that run chose them: other values still land
    other = get_preset("paper-cpu").with_learner_settings(["per_view.cot.train.max_steps=23000",
                                                           "per_view.cot.train.min_lr_ratio=0.05"])
    cot = other.run_config("cot", "t", "v").train
    assert (cot.max_steps, cot.min_lr_ratio) == (23000, 0.05)


def test_data_view_is_refused_per_learner_as_data_learner_is(capsys, tmp_path):
    for key in ("data.view", "data.learner"):
        err = one_line_error(capsys, ["run", "length", "--preset", "smoke", "--out", str(tmp_path / "x"), "--quiet",
                                      f"--learner-setting=per_learner.rm.{key}=cot"])
        assert key in err and "cannot be set per learner" in err
    assert not (tmp_path / "x").exists()


def test_an_old_experiment_json_reads_with_the_new_table_names(tmp_path):
    from rlmlab.experiments import folder, kinds
    from rlmlab.experiments.presets import EXPERIMENT_PRESETS, preset_record

    # The shortcuts-paper-cpu experiment.json as written before the rename (a later export
    # rewrote the committed one under the new names).
    committed = ROOT / "tests" / "fixtures" / "experiment-old-table-names.json"
    saved = json.loads(committed.read_text())
    assert {"per_view", "iid_per_view", "shortcut_per_view"} <= saved["preset"].keys()
    assert "per_learner" not in saved["preset"]
    shutil.copy(committed, tmp_path / "experiment.json")
    for read in (folder.read_experiment_json, kinds.read_experiment):
        preset = read(tmp_path)["preset"]
        assert not {"per_view", "shortcut_per_view", "iid_per_view"} & preset.keys()
        assert preset["per_learner"] == saved["preset"]["per_view"]
        assert preset["iid_per_learner"] == saved["preset"]["iid_per_view"]
        assert preset["shortcut_per_learner"] == saved["preset"]["shortcut_per_view"]
    assert preset_record({"per_learner": {}}) == {"per_learner": {}}
    assert set(preset_record(saved["preset"])) <= set(EXPERIMENT_PRESETS["paper-cpu"].__dataclass_fields__)
    (tmp_path / "experiment.json").write_text(json.dumps({**saved, "preset": {**saved["preset"], "per_learner": {}}}))
    with pytest.raises(DataError, match="'per_view' is the old name of 'per_learner'"):
        folder.read_experiment_json(tmp_path)


def test_an_experiment_in_progress_under_the_old_names_resumes(tmp_path, capsys):
    """The state of the long runs when the names changed: experiment.json with per_view, a run's
    config.json with data.view, checkpoints of format /2, no done.json yet. Re-running the same
    command resumes the run from its `last` checkpoint and finishes it."""
    out = tmp_path / "exp"
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]
    assert main([*argv, "--max-steps", "2"]) == 0
    run = out / "length-96" / "rm"
    meta = json.loads((out / "experiment.json").read_text())
    for old, new in (("per_view", "per_learner"), ("shortcut_per_view", "shortcut_per_learner"),
                     ("iid_per_view", "iid_per_learner")):
        meta["preset"][old] = meta["preset"].pop(new)
    (out / "experiment.json").write_text(json.dumps(meta, indent=2) + "\n")
    for which in ("last", "best"):
        to_old_checkpoint(run / which)
    to_old_config(run / "config.json")
    (run / "done.json").unlink()
    shutil.rmtree(run / "eval")
    assert main([*argv, "--max-steps", "4"]) == 0
    assert json.loads((run / "done.json").read_text())["step"] == 4
    resumed = [r for r in read_metrics(run) if r.get("kind") == "resume"]
    assert resumed and resumed[-1]["step"] == 2
    assert json.loads((run / "last" / "checkpoint.json").read_text())["format"] == ck.FORMAT
    assert "per_learner" in json.loads((out / "experiment.json").read_text())["preset"]
    assert json.loads((run / "eval" / "summary.json").read_text())["learner"] == "rm"


# --- summaries and reports ----------------------------------------------------------------------

def test_summaries_that_say_view_are_read_as_naming_the_learner(tmp_path):
    from rlmlab.measuring.result_files import summary_learner

    committed = RESULTS / "length-197-small" / "length-197" / "cot" / "eval" / "eval" / "summary.json"
    old = json.loads(committed.read_text())
    assert old["view"] == "cot" and "learner" not in old  # written before the rename
    assert summary_learner(old) == "cot"
    # An experiment's learner with its own encoding was recorded beside its view.
    assert summary_learner({"view": "cot", "learner": "cot@rope"}) == "cot@rope"
    assert summary_learner({"learner": "rm"}) == "rm" and summary_learner({}) is None


def test_the_viewer_reads_an_old_evaluation_folder(tmp_path):
    from rlmlab.experiments.viewer import embedded_data

    src = RESULTS / "length-197-small" / "length-197" / "rm" / "eval" / "eval"
    assert json.loads((src / "summary.json").read_text())["view"] == "rm"
    shutil.copytree(src, tmp_path / "eval")
    assert main(["view", str(tmp_path / "eval"), "--out", str(tmp_path / "html"), "--limit", "5", "--quiet"]) == 0
    page = (tmp_path / "html" / "index.html").read_text()
    data = embedded_data(page)
    assert (data["learner"], data["driver"]) == ("rm", "rm") and "learner <b>RM</b>" in page


def test_an_eval_over_an_old_oracle_evaluation_replaces_it(tmp_path, capsys):
    data = tmp_path / "e.txt"
    data.write_text("add(1,2)\nsquare(3)\n")
    out = tmp_path / "o"
    assert main(["eval", "--oracle", "rm", "--data", str(data), "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["learner"] == "rm" and "view" not in summary
    summary["view"] = summary.pop("learner")  # as an evaluation from before the rename says it
    (out / "summary.json").write_text(json.dumps(summary))
    assert main(["eval", "--oracle", "rm", "--data", str(data), "--out", str(out), "--quiet"]) == 0
    assert "another predictor" in one_line_error(capsys, ["eval", "--oracle", "cot", "--data", str(data),
                                                          "--out", str(out), "--quiet"])


def test_an_old_report_json_names_the_same_cells_as_a_new_one():
    from rlmlab.experiments.reproduce import report_cells

    new = {"points": [{"job": "length-33", "learner": "rm", "below": {"n": 4, "accuracy": 0.5, "ci95": [0.1, 0.9]}}]}
    old = {"points": [{"job": "length-33", "view": "rm", "below": {"n": 4, "accuracy": 0.5, "ci95": [0.1, 0.9]}}]}
    assert report_cells(old) == report_cells(new) == {"points[job=length-33,learner=rm].below": new["points"][0]["below"]}

"""Bad input from a user ends in a one-line error naming the problem, never a traceback:
the CLI exits 2, the library raises an `RlmlabError` subclass."""

import json
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import one_line_error

from rlmlab.cli import main
from rlmlab.errors import CheckpointError, ConfigError, DataError, ExprError
from rlmlab.experiments.kinds import get_kind
from rlmlab.experiments.presets import get_preset
from rlmlab.experiments.report import report
from rlmlab.learning.examples import build_examples
from rlmlab.learning.resume import TrainerState, restore_optimizer, set_rng_state
from rlmlab.measuring.result_files import read_results, write_rows
from rlmlab.measuring.score import data_columns
from rlmlab.task.expr import MAX_NESTING
from rlmlab.task.pool import read_pool
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def test_literals_and_runaway_nesting_are_expression_errors(capsys):
    assert "is a literal" in one_line_error(capsys, ["trace", "7"])
    with pytest.raises(ExprError, match="literal"):
        PAPER.execute("True")
    deep = "square(" * (MAX_NESTING + 1) + "3" + ")" * (MAX_NESTING + 1)
    assert f"nested more than {MAX_NESTING} deep" in one_line_error(capsys, ["trace", deep])
    at_limit = "square(" * MAX_NESTING + "3" + ")" * MAX_NESTING
    assert PAPER.parse(at_limit) and PAPER.execute(at_limit).value == pow(3, 2 ** MAX_NESTING, 10)


def test_paths_the_os_refuses(tmp_path, capsys):
    err = one_line_error(capsys, ["eval", "--oracle", "rm", "--quiet", "--data", str(tmp_path)])
    assert str(tmp_path) in err
    blocker = tmp_path / "file"
    blocker.write_text("")
    one_line_error(capsys, ["data", "pool", "--n", "5", "--quiet", "--out", str(blocker / "pool.parquet")])
    assert "workers must be at least 1" in one_line_error(
        capsys, ["data", "pool", "--n", "5", "--quiet", "--workers", "-1", "--out", str(tmp_path / "p.parquet")])


def test_every_row_of_a_data_file_is_checked(tmp_path):
    good = ["add(1,2)"] * 70  # past the rows read_pool re-parses up front
    pq.write_table(pa.table({"expr": good + [None]}), tmp_path / "null.parquet")
    with pytest.raises(DataError, match="row 70: empty"):
        read_pool(tmp_path / "null.parquet", task=PAPER)
    pq.write_table(pa.table({"expr": [1, 2]}), tmp_path / "ints.parquet")
    with pytest.raises(DataError, match="holds int64, not strings"):
        read_pool(tmp_path / "ints.parquet", task=PAPER)
    with pytest.raises(DataError, match="expression 70 .*literal"):
        build_examples(good + ["7"], "rm", PAPER.vocab, task=PAPER)
    # A byte damaged inside stored text past those rows: the file still decodes, its text is not UTF-8.
    pq.write_table(pa.table({"expr": good + ["add(3,4)"]}), tmp_path / "text.parquet", compression="none",
                   use_dictionary=False, write_statistics=False)
    raw = (tmp_path / "text.parquet").read_bytes()
    assert raw.count(b"add(3,4)") == 1
    (tmp_path / "text.parquet").write_bytes(raw.replace(b"add(3,4)", b"add(3,\xff)"))
    with pytest.raises(DataError, match="not a readable parquet file"):
        read_pool(tmp_path / "text.parquet", task=PAPER)


def test_a_damaged_view_cache_is_rebuilt(tmp_path):
    exprs = ["add(1,2)", "square(triple_add(1,2,3))"]
    first = build_examples(exprs, "cot", PAPER.vocab, cache_dir=tmp_path, task=PAPER)
    (cached,) = tmp_path.glob("*.npz")
    cached.write_bytes(cached.read_bytes()[:40])  # a save cut short
    with pytest.raises(zipfile.BadZipFile):
        np.load(cached)
    again = build_examples(exprs, "cot", PAPER.vocab, cache_dir=tmp_path, task=PAPER)
    assert np.array_equal(first.ids, again.ids) and np.array_equal(first.loss, again.loss)


@pytest.mark.parametrize("saved, message", [
    ({"step": "x"}, "step"),
    ({"step": 3, "stream": {"epoch": 0}}, "stream"),
    ({"step": 3, "momentum": 1}, "unexpected keyword"),
    ({"step": True}, "step"),
    ({"step": -1}, "step"),
    ({"step": 3, "stream": {"epoch": -1, "cursor": 0}}, "stream"),
    ({"step": 3, "stream": {"epoch": 2**64, "cursor": 0}}, "stream"),
])
def test_malformed_trainer_state(tmp_path, saved, message):
    with pytest.raises(CheckpointError, match=message):
        TrainerState.from_saved(saved, tmp_path)
    assert TrainerState.from_saved({"step": 3, "elapsed_s": 1.5}, tmp_path).step == 3


def test_malformed_optimizer_and_rng_state():
    opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    for meta in ({"scalars": 5, "param_groups": []}, {"scalars": {"x": 1}, "param_groups": []}, {}):
        with pytest.raises(CheckpointError, match="optimizer state"):
            restore_optimizer(opt, {}, meta)
    for state in (None, {}, {"torch": "not base64!"}, {"torch": "AAAA"}):
        with pytest.raises(CheckpointError, match="random-number state"):
            set_rng_state(state)


def test_malformed_experiment_descriptions(tmp_path):
    for text, message in (("[]", "not an experiment description"),
                          ('{"kind": "length", "split": {}}', "needs 'threshold'"),
                          ('{"kind": "iid", "sizes": 3}', "needs 'sizes'")):
        (tmp_path / "experiment.json").write_text(text)
        with pytest.raises(DataError, match=message):
            report(tmp_path)


def test_saved_data_built_under_other_settings_is_refused(tmp_path):
    smoke = get_preset("smoke")
    assert len(get_kind("length").plan(smoke, tmp_path, ("rm", "cot"), task=PAPER)) == 2
    with pytest.raises(ConfigError, match=r"built with per_bin_cap=4 \(asked: 5\)"):
        get_kind("length").plan(smoke.with_overrides(per_bin_cap=5), tmp_path, ("rm", "cot"), task=PAPER)
    with pytest.raises(ConfigError, match="threshold must be a positive integer"):
        get_kind("length").plan(smoke, tmp_path, ("rm", "cot"), threshold=0, task=PAPER)


def test_data_columns_keep_only_json_scalars(tmp_path):
    path = tmp_path / "set.parquet"
    pq.write_table(pa.table({"expr": ["add(1,2)"], "bin": ["0.5-1.0"], "n": [3], "ok": [True],
                             "when": pa.array([0], pa.timestamp("s")), "raw": pa.array([b"x"], pa.binary()),
                             "deep": pa.array([[1]], pa.list_(pa.int64()))}), path)
    cols = data_columns(path, 1)
    assert cols == [{"bin": "0.5-1.0", "n": 3, "ok": True}]
    json.dumps(cols)


@pytest.mark.parametrize("override", ["--train.seed=-1", "--data.val_seed=-1", f"--train.seed={2**63}"])
def test_seeds_outside_what_the_generators_take_are_config_errors(tmp_path, capsys, override):
    err = one_line_error(capsys, ["train", "--data", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "r"),
                                  "--max-steps", "1", override])
    assert "seed" in err and "[0, 2**63 - 1]" in err


def test_config_and_checkpoint_files_nested_too_deeply(tmp_path, capsys):
    deep = "[" * 200_000 + "]" * 200_000
    (tmp_path / "deep.json").write_text(deep)
    err = one_line_error(capsys, ["train", "--config", str(tmp_path / "deep.json"), "--data", "x.parquet",
                                  "--out", str(tmp_path / "r"), "--max-steps", "1"])
    assert "nested too deeply" in err
    ckpt = tmp_path / "run" / "best"
    ckpt.mkdir(parents=True)
    (ckpt / "checkpoint.json").write_text(deep)
    from rlmlab.learning.checkpoint import read_checkpoint_meta

    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_checkpoint_meta(ckpt)


def test_a_closed_standard_output_is_a_one_line_error(monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys, "stdout", None)
    assert main(["trace", "add(1,2)"]) == 2
    assert capsys.readouterr().err == "rlmlab trace: error: standard output is closed\n"


def test_an_experiment_folder_of_another_kind_is_refused(tmp_path, capsys):
    out = tmp_path / "exp"
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]) == 0
    before = (out / "experiment.json").read_text()
    err = one_line_error(capsys, ["run", "depth", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"])
    assert "holds another experiment (kind 'length', not 'depth')" in err
    err = one_line_error(capsys, ["run", "length", "--threshold", "90", "--preset", "smoke", "--out", str(out),
                                  "--quiet", "--learners", "rm"])
    assert "threshold 96, not 90" in err
    assert (out / "experiment.json").read_text() == before


def test_damaged_finished_markers_are_not_trusted(tmp_path, capsys):
    out = tmp_path / "exp"
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]
    assert main(argv) == 0
    run = out / "length-96" / "rm"
    eval_dir = run / "eval"
    good = read_results(eval_dir)
    raw = (eval_dir / "results.parquet").read_bytes()
    # A truncated results file (cut short, or holding fewer results than its summary counts) is
    # evaluated again, to the same results.
    for damage in (lambda: (eval_dir / "results.parquet").write_bytes(raw[: len(raw) // 2]),
                   lambda: write_rows(eval_dir, good[:1])):
        damage()
        assert main(argv) == 0
        assert "damaged evaluation files" in capsys.readouterr().err
        assert read_results(eval_dir) == good
    # A garbage done.json is not taken as finished: the run resumes from its last checkpoint.
    (run / "done.json").write_text("garbage")
    assert main(argv) == 0
    assert "not a finished-run marker" in capsys.readouterr().err
    assert json.loads((run / "done.json").read_text())["stop_reason"] == "max_steps"


def test_training_data_errors_name_the_row_of_the_users_file_and_quote_it_short(tmp_path, capsys):
    rows = [f"add({i % 10},{i // 10 % 10})" for i in range(300)]
    rows[150] = "add(1," + "2," * 500_000 + "3)"  # a 1 MB malformed line
    pq.write_table(pa.table({"expr": rows}), tmp_path / "pool.parquet")
    err = one_line_error(capsys, ["train", "--data", str(tmp_path / "pool.parquet"), "--out", str(tmp_path / "r"),
                                  "--max-steps", "1", "--data.val_size=50", "--data.cache_dir="])
    assert f"{tmp_path / 'pool.parquet'}: row 150 (" in err  # the file's row, not its index after the split
    assert len(err) < 600


def test_a_view_cache_with_ids_outside_the_vocabulary_is_refused_and_rebuilt(tmp_path):
    from rlmlab.learning.examples import ExampleSet

    exprs = ["add(1,2)", "square(triple_add(1,2,3))"]
    first = build_examples(exprs, "cot", PAPER.vocab, cache_dir=tmp_path, task=PAPER)
    (cached,) = tmp_path.glob("*.npz")
    bad = ExampleSet(first.learner, first.vocab, first.ids.copy(), first.loss, first.offsets, first.source,
                   first.n_expressions)
    bad.ids[3] = len(PAPER.vocab) + 7  # a token id the embedding table does not have
    bad.save(cached)
    with pytest.raises(DataError, match="outside the vocabulary"):
        ExampleSet.load(cached)
    again = build_examples(exprs, "cot", PAPER.vocab, cache_dir=tmp_path, task=PAPER)
    assert np.array_equal(first.ids, again.ids)
    assert np.array_equal(ExampleSet.load(cached).ids, first.ids)  # the damaged entry was overwritten

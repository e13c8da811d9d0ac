"""Hostile input, one test per failure class: sizes beyond memory, files that are not regular
files, deep or broken JSON, poisoned caches, edited checkpoints, folders of another kind, the
order of effects, ignored settings, echoed input, oracle decoding cost and link targets. Each
ends in one line on stderr and exit status 2 (or a library `RlmlabError`), with nothing
written, or in the documented correct behaviour."""

import json
import math
import os
import random
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import one_line_error as conftest_one_line_error
from conftest import reseal_examples_cache, write_as_legacy

from rlmlab.cli import main
from rlmlab.errors import CheckpointError, DataError
from rlmlab.learning import checkpoint as ck
from rlmlab.learning.examples import ExampleSet, build_examples
from rlmlab.learning.model import Transformer, preset
from rlmlab.learning.resume import TrainerState
from rlmlab.measuring.result_files import read_results, write_results
from rlmlab.measuring.score import read_expressions
from rlmlab.safeio import MAX_DEPTH, parse_json
from rlmlab.task.pool import read_pool
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

RELEASED = ck.Path(__file__).resolve().parent.parent / "rlmlab" / "released" / "paper-cpu-length-595"


def one_line_error(capsys, argv: list[str]) -> str:
    """Hostile input may be refused by the argument parser too (`rlmlab: error: ...`)."""
    return conftest_one_line_error(capsys, argv, from_command=False)


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> ck.Path:
    path = tmp_path_factory.mktemp("pool") / "pool.parquet"
    assert main(["data", "pool", "--n", "60", "--quiet", "--out", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> ck.Path:
    """A finished smoke experiment (one learner): the folder other commands must not mix into."""
    out = tmp_path_factory.mktemp("exp") / "length"
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--quiet", "--learners", "rm"]) == 0
    return out


def _files(folder: ck.Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and p.name != ".lock"}


# --- sizes checked against memory before allocating ------------------------------------------

@pytest.mark.parametrize("setting", ["--model.block_size=1000000000", "--model.n_embd=1099511627776",
                                     "--train.batch_size=99999999999999999999999"])
def test_sizes_beyond_memory_are_refused_before_allocating(tmp_path, capsys, pool, setting):
    err = one_line_error(capsys, ["train", "--data", str(pool), "--out", str(tmp_path / "r"), "--max-steps", "1",
                                  "--preset", "tiny", "--data.val_size=10", setting])
    assert "more than this machine's" in err and "of memory" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("setting", ["--preset.pool_n=99999999999999999999",
                                     "--learner-setting=per_learner.rm.train.batch_size=99999999999999999999999"])
def test_experiment_sizes_beyond_memory_are_refused(tmp_path, capsys, setting):
    err = one_line_error(capsys, ["run", "length", "--preset", "smoke", "--out", str(tmp_path / "e"), "--quiet",
                                  setting])
    assert "of memory" in err and not (tmp_path / "e").exists()


def test_a_checkpoint_claiming_a_huge_model_is_refused(tmp_path, capsys):
    run = _saved(tmp_path)
    meta_path = run / "best" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta["model_config"]["n_embd"] = 2 ** 40
    meta["digest"] = ck.meta_digest(meta)  # consistent: only the size check can refuse it
    meta_path.write_text(json.dumps(meta))
    (run / "e.txt").write_text("add(1,2)\n")
    assert "of memory" in one_line_error(capsys, ["eval", str(run), "--data", str(run / "e.txt"), "--quiet"])


# --- regular files only --------------------------------------------------------------------

@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_devices_and_fifos_are_not_read_as_files(tmp_path, capsys, pool, special):
    if special == "fifo":
        special = str(tmp_path / "fifo")
        os.mkfifo(special)
    for argv in (["train", "--config", special, "--data", str(pool), "--out", str(tmp_path / "r"), "--max-steps", "1"],
                 ["eval", "--oracle", "rm", "--data", special, "--quiet", "--out", str(tmp_path / "o")]):
        assert "not a regular file" in one_line_error(capsys, argv)
    assert not (tmp_path / "r").exists() and not (tmp_path / "o").exists()


# --- bounded JSON ----------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
MODERATE = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)  # parses, but nested past any file we write


@pytest.mark.parametrize("text", [DEEP, MODERATE, '{"a": 1}\n' + "{" * 3000])
def test_deep_json_in_results_and_summaries_is_one_error(tmp_path, text):
    (tmp_path / "results.jsonl").write_text(text + "\n")
    with pytest.raises(DataError, match="nested too deeply|not valid JSON"):
        read_results(tmp_path)
    from rlmlab.experiments.viewer import read_eval_set

    (tmp_path / "results.jsonl").write_text('{"expr": "add(1,2)", "correct": true}\n')
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(DataError, match="nested too deeply|not valid JSON"):
        read_eval_set(tmp_path)


@pytest.mark.parametrize("text", [DEEP, MODERATE, '{"a": 1}\n' + "{" * 3000])
def test_deep_json_in_a_results_parquet_and_its_metadata_is_one_error(tmp_path, text):
    """The Parquet twin: a column the file's metadata says holds JSON text, or that metadata itself."""
    from rlmlab.experiments.viewer import read_eval_set
    from rlmlab.records import FORMAT, META_KEY

    meta = json.dumps({"format": FORMAT, "optional": [], "json": ["extra"]})
    table = pa.table({"expr": ["add(1,2)"], "correct": [True], "extra": [text]})
    for metadata in ({META_KEY: meta}, {META_KEY: text}):
        pq.write_table(table.replace_schema_metadata(metadata), tmp_path / "results.parquet")
        for read in (read_results, read_eval_set):
            with pytest.raises(DataError, match="nested too deeply|not valid JSON") as e:
                read(tmp_path)
            assert "\n" not in str(e.value)
    (tmp_path / "results.parquet").unlink()
    write_results(tmp_path, [{"expr": "add(1,2)", "correct": True}], {})
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(DataError, match="nested too deeply|not valid JSON"):
        read_eval_set(tmp_path)


def test_parquet_vocabulary_metadata_deep_or_not_utf8_is_one_error(tmp_path):
    table = pa.table({"expr": ["add(1,2)"]})
    for raw, message in ((DEEP.encode(), "nested too deeply"), (b'{"tokens": ["\xff"]}', "not UTF-8")):
        pq.write_table(table.replace_schema_metadata({b"rlmlab.task.vocab": raw}), tmp_path / "p.parquet")
        with pytest.raises(DataError, match=message):
            read_pool(tmp_path / "p.parquet", task=PAPER)


def test_a_config_read_by_extend_nested_deeply_is_one_error(tmp_path):
    from rlmlab.experiments.run_job import reopen_to_extend
    from rlmlab.learning.config import TrainConfig

    (tmp_path / "done.json").write_text('{"step": 4, "stop_reason": "max_steps"}')
    (tmp_path / "config.json").write_text('{"train": ' + DEEP + "}")
    with pytest.raises(DataError, match="not what `rlmlab run` writes"):
        reopen_to_extend(tmp_path, TrainConfig(max_steps=9))


def test_id_columns_binary_refused_nan_written_as_null(tmp_path, capsys):
    pq.write_table(pa.table({"expr": ["add(1,2)"], "id": pa.array([b"\x00\xff"], pa.binary())}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match="'id' column holds binary"):
        read_expressions(tmp_path / "b.parquet", task=PAPER)
    pq.write_table(pa.table({"expr": ["add(1,2)", "double(3)"], "id": [float("nan"), 2.0]}), tmp_path / "n.parquet")
    assert main(["eval", "--oracle", "rm", "--data", str(tmp_path / "n.parquet"), "--quiet",
                 "--out", str(tmp_path / "o")]) == 0

    # A null, as other readers of the table see it, not a NaN.
    assert pq.read_table(tmp_path / "o" / "results.parquet", columns=["id"]).column("id").null_count == 1
    rows = read_results(tmp_path / "o")
    assert sorted(r["id"] for r in rows if r["id"] is not None) == [2.0] and sum(r["id"] is None for r in rows) == 1


def test_parse_json_bounds_depth_without_recursion():
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x") == parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x")
    with pytest.raises(DataError, match="nested too deeply"):
        parse_json(MODERATE, "x")


# --- poisoned training-examples caches ----------------------------------------------------------

@pytest.mark.parametrize("poison", [
    dict(ids=np.zeros(0, np.uint16), loss=np.zeros(0, bool), offsets=np.zeros(0, np.int64),
         source=np.zeros(0, np.int64)),
    "2-D offsets", "offsets as floats"])
def test_poisoned_view_caches_are_refused_and_rebuilt(tmp_path, poison):
    exprs = ["add(1,2)", "double(3)", "square(triple_add(1,2,3))"]
    fresh = build_examples(exprs, "rm", PAPER.vocab, cache_dir=tmp_path, task=PAPER)
    (path,) = tmp_path.glob("*.npz")
    offsets = np.load(path)["offsets"]
    if poison == "2-D offsets":
        poison = dict(offsets=offsets.reshape(1, -1))
    elif poison == "offsets as floats":
        poison = dict(offsets=offsets.astype(np.float64))
    reseal_examples_cache(path, **poison)
    with pytest.raises(DataError, match="wrong shape or type"):
        ExampleSet.load(path)
    again = build_examples(exprs, "rm", PAPER.vocab, cache_dir=tmp_path, task=PAPER)
    assert np.array_equal(again.ids, fresh.ids) and np.array_equal(again.offsets, fresh.offsets)


# --- the checkpoint's metadata covered by its digest -------------------------------------------

def _saved(tmp_path) -> ck.Path:
    run = tmp_path / "run"
    vocab = PAPER.vocab
    torch.manual_seed(0)
    ck.save_checkpoint(run, "best", Transformer(preset("tiny", "rm", len(vocab))), vocab=vocab, learner="rm",
                       config={"model": {"preset": "tiny"}}, step=3, metrics={})
    return run


def _swap(meta: dict, what: str) -> None:
    if what == "vocab":
        meta["vocab"][12], meta["vocab"][13] = meta["vocab"][13], meta["vocab"][12]  # digits 0 and 1
    elif what == "learner":  # the released checkpoints (format /2) name it "view"
        key = "learner" if "learner" in meta else "view"
        meta[key] = "cot" if meta[key] == "rm" else "rm"
    else:
        meta["model_config"]["n_head"] = 4 if meta["model_config"]["n_head"] != 4 else 2


@pytest.mark.parametrize("what", ["vocab", "learner", "n_head"])
def test_editing_a_released_checkpoints_metadata_is_refused(tmp_path, capsys, what):
    run = tmp_path / "rm"
    shutil.copytree(RELEASED / "rm", run)
    assert ck.load_run(run).step == json.loads((RELEASED / "rm" / "best" / "checkpoint.json").read_text())["step"]
    meta_path = run / "best" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    _swap(meta, what)
    meta_path.write_text(json.dumps(meta, indent=1))
    (tmp_path / "e.txt").write_text("add(1,2)\n")
    err = one_line_error(capsys, ["eval", str(run), "--data", str(tmp_path / "e.txt"), "--quiet",
                                  "--out", str(tmp_path / "o")])
    assert "was edited after it was saved" in err and not (tmp_path / "o").exists()


def test_an_empty_files_entry_is_refused_and_legacy_checkpoints_still_load(tmp_path):
    run = _saved(tmp_path)
    meta_path = run / "best" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    for files in ({}, {"optimizer.safetensors": "0" * 64}):
        forged = {**meta, "files": files}
        forged["digest"] = ck.meta_digest(forged)
        meta_path.write_text(json.dumps(forged))
        with pytest.raises(CheckpointError, match="lacks the SHA-256 of model.safetensors"):
            ck.load_run(run)
    # A checkpoint written before the digest (and before the learner had its name), its tensor
    # files as that format wrote them, loads by its tensor checksums, as it did.
    meta_path.write_text(json.dumps(meta))
    write_as_legacy(run / "best")
    legacy = json.loads(meta_path.read_text())
    assert ck.load_run(run).step == 3
    meta_path.write_text(json.dumps({**legacy, "files": {}}))
    with pytest.raises(CheckpointError, match="lacks the SHA-256"):
        ck.load_run(run)


# --- finiteness and types of trainer state ------------------------------------------------------

@pytest.mark.parametrize("saved, bad", [
    ({"step": 3, "dropped": "x"}, "dropped"),
    ({"step": 3, "dropped": {"train": -1}}, "dropped"),
    ({"step": 3, "best_score": float("nan")}, "best_score"),
    ({"step": 3, "best_score": float("inf")}, "best_score"),
    ({"step": 3, "elapsed_s": float("inf")}, "elapsed_s"),
    ({"step": 3, "cpu_s": float("nan")}, "cpu_s"),
    ({"step": 3, "schedule_steps": -5}, "schedule_steps"),
    ({"step": 3, "best_step": "7"}, "best_step"),
    ({"step": 3, "select_metric": 5}, "select_metric"),
])
def test_trainer_state_must_be_finite_and_typed(tmp_path, saved, bad):
    with pytest.raises(CheckpointError, match=bad):
        TrainerState.from_saved(saved, tmp_path)
    ok = TrainerState.from_saved({"step": 3, "best_score": 0.5, "dropped": {"train": 2}, "schedule_steps": 10}, tmp_path)
    assert ok.best_score == 0.5 and math.isfinite(ok.elapsed_s)


# --- folder kinds and experiment identity, checked before any write --------------------------------

def test_train_into_an_experiment_folder_is_refused(experiment, capsys, pool):
    before = _files(experiment)
    err = one_line_error(capsys, ["train", "--data", str(pool), "--out", str(experiment), "--max-steps", "1",
                                  "--preset", "tiny", "--data.val_size=10"])
    assert "holds an experiment, not a training run" in err
    assert _files(experiment) == before


def test_run_into_a_training_run_folder_is_refused(experiment, tmp_path, capsys):
    run = experiment / "length-96" / "rm"
    before = _files(run)
    for extra in ([], ["--extend"]):
        err = one_line_error(capsys, ["run", "length", "--preset", "smoke", "--out", str(run), "--quiet",
                                      "--learners", "rm", *extra])
        assert "holds a training run, not an experiment" in err
    assert _files(run) == before


def test_export_only_into_an_export_of_the_same_experiment_and_never_through_links(experiment, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(experiment / "length-96" / "rm", run)
    before = _files(run)
    assert "holds a training run" in one_line_error(capsys, ["export", str(experiment), str(run)])
    assert _files(run) == before
    # An export of the same kind and threshold on another pool is another experiment.
    other = tmp_path / "other"
    shutil.copytree(experiment, other / "src")
    meta = json.loads((other / "src" / "experiment.json").read_text())
    meta["preset"]["pool_seed"] = 7
    (other / "src" / "experiment.json").write_text(json.dumps(meta))
    assert main(["export", str(other / "src"), str(other / "dest")]) == 0
    capsys.readouterr()
    exported = _files(other / "dest")
    assert "holds another experiment (pool" in one_line_error(capsys, ["export", str(experiment),
                                                                        str(other / "dest")])
    assert _files(other / "dest") == exported
    # A destination holding a symbolic link would be written through.
    dest, outside = tmp_path / "dest", tmp_path / "outside.json"
    outside.write_text("mine")
    dest.mkdir()
    (dest / "experiment.json").symlink_to(outside)
    assert "symbolic link" in one_line_error(capsys, ["export", str(experiment), str(dest)])
    assert outside.read_text() == "mine"


def test_a_folder_where_a_run_file_belongs_is_refused_not_passed_over(experiment, tmp_path, capsys):
    """A folder named results.parquet once made the report drop that run's row, and one named
    config.json made export leave the run out, both exiting 0."""
    copy = tmp_path / "copy"
    shutil.copytree(experiment, copy)
    results = next(copy.rglob("results.parquet"))
    saved = results.read_bytes()
    results.unlink()
    results.mkdir()
    assert f"{results}: is a folder" in one_line_error(capsys, ["report", str(copy)])
    results.rmdir()
    results.write_bytes(saved)
    config = copy / "length-96" / "rm" / "config.json"
    config.unlink()
    config.mkdir()
    assert f"{config}: is a folder" in one_line_error(capsys, ["export", str(copy), str(tmp_path / "dest")])
    assert not (tmp_path / "dest").exists()


def test_eval_over_another_predictors_evaluation_is_refused(experiment, tmp_path, capsys):
    run = experiment / "length-96" / "rm"
    data = tmp_path / "e.txt"
    data.write_text("add(1,2)\ndouble(3)\n")
    theirs = run / "eval"
    before = _files(theirs)
    err = one_line_error(capsys, ["eval", "--oracle", "rm", "--data", str(data), "--quiet",
                                  "--out", str(theirs)])
    assert "holds the evaluation of another predictor" in err and _files(theirs) == before
    assert "holds a training run" in one_line_error(capsys, ["eval", "--oracle", "rm", "--data", str(data),
                                                             "--quiet", "--out", str(run)])
    # The same predictor evaluating again replaces its own evaluation.
    mine = tmp_path / "mine"
    for _ in range(2):
        assert main(["eval", "--oracle", "rm", "--data", str(data), "--quiet", "--out", str(mine)]) == 0


# --- checks before moves; no record of refused commands -------------------------------------------

def test_extend_checks_the_run_can_resume_before_moving_its_outputs(experiment, tmp_path):
    from rlmlab.experiments.run_job import reopen_to_extend
    from rlmlab.learning.config import TrainConfig

    run = tmp_path / "rm"
    shutil.copytree(experiment / "length-96" / "rm", run)
    before = _files(run)
    (run / "last" / "model.safetensors").write_bytes(b"damaged")
    with pytest.raises(CheckpointError, match="corrupt"):
        reopen_to_extend(run, TrainConfig(max_steps=50))
    assert (run / "done.json").exists() and (run / "eval").is_dir()
    assert not list(run.glob("superseded-step*"))
    assert {p for p in _files(run)} == set(before)


def test_a_refused_run_leaves_no_command_record(experiment, capsys):
    before = (experiment / "commands.jsonl").read_text()
    one_line_error(capsys, ["run", "depth", "--preset", "smoke", "--out", str(experiment), "--quiet", "--learners", "rm"])
    one_line_error(capsys, ["run", "length", "--preset", "small", "--out", str(experiment), "--quiet",
                            "--learners", "rm"])  # another preset: another experiment
    assert (experiment / "commands.jsonl").read_text() == before


@pytest.mark.parametrize("argv", [
    ["run", "length", "--preset", "smoke", "--threshold", "-3"],
    ["run", "depth", "--preset", "smoke", "--threshold", "0"],
    ["run", "iid", "--preset", "smoke", "--sizes", "0"],
    ["run", "shortcuts", "--preset", "smoke", "--constructions", "nope"],
    ["run", "sweep", "--preset", "smoke", "--lengths", "-1"],
])
def test_a_refused_run_leaves_no_folder_behind(tmp_path, capsys, argv):
    """Options are checked before the pool is built, and the folder the run's lock created
    (with every parent it had to make) is removed again."""
    one_line_error(capsys, argv + ["--out", str(tmp_path / "new" / "exp"), "--quiet"])
    assert list(tmp_path.iterdir()) == []


def test_settings_a_job_sets_itself_are_refused_not_ignored(tmp_path, capsys):
    for key in ("data.train=x.parquet", "data.val=x.parquet", "data.learner=cot", "train.seed=3"):
        err = one_line_error(capsys, ["run", "length", "--preset", "smoke", "--out", str(tmp_path / "e"), "--quiet",
                                      f"--learner-setting=per_learner.rm.{key}"])
        assert "cannot be set per learner" in err
    assert not (tmp_path / "e").exists()


# --- echoed input cut short --------------------------------------------------------------------

def test_errors_echo_at_most_a_few_hundred_characters(tmp_path, capsys):
    err = one_line_error(capsys, ["trace", "x" * 10_000_000])
    assert len(err) < 700
    err = one_line_error(capsys, ["trace", "add(1," * 200_000])
    assert len(err) < 700 and "1,200,000 characters" in err
    (tmp_path / "e.txt").write_text("add(1,2)\n" + "foo(" * 1_000_000 + "\n")
    err = one_line_error(capsys, ["eval", "--oracle", "rm", "--data", str(tmp_path / "e.txt"), "--quiet",
                                  "--out", str(tmp_path / "o")])
    assert len(err) < 700


@pytest.mark.parametrize("argv", [[], ["train"], ["run", "nosuchkind", "--out", "x"], ["eval", "--bogus"],
                                  ["trace"], ["data"]])
def test_usage_errors_are_one_line_with_a_pointer_to_help(capsys, argv):
    err = one_line_error(capsys, argv)
    assert "--help)" in err and "usage:" not in err


def test_binary_input_to_trace_is_one_error():
    import subprocess
    import sys

    # Seeded bytes behind 0xff (never UTF-8): random bytes alone sometimes open with a short line
    # that decodes as text, which `trace -` reports as a bad expression before the binary line.
    binary = b"\xff" + random.Random(0).randbytes(4000) + b"\n" * 100
    proc = subprocess.run([sys.executable, "-m", "rlmlab", "trace", "-"], input=binary, capture_output=True)
    assert proc.returncode == 2
    assert proc.stderr.count(b"\n") == 1 and b"line 1: not text" in proc.stderr and b"Traceback" not in proc.stderr
    # Lines are read as they come: a text line before binary ones is traced (or reported) first.
    proc = subprocess.run([sys.executable, "-m", "rlmlab", "trace", "-"], input=b"75\n" + binary, capture_output=True)
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1].endswith(b"line 2: not text (binary input?)")


# --- oracle decoding near-linear in the trace length ---------------------------------------------

def _tree(height: int) -> str:
    return "3" if height == 0 else f"triple_add({_tree(height - 1)},{_tree(height - 1)},{_tree(height - 1)})"


@pytest.mark.parametrize("learner", ["rm", "cot"])
def test_oracle_decoding_touches_each_token_a_bounded_number_of_times(monkeypatch, learner):
    """Tokens the oracle compares, per trace token: a per-step cost proportional to the frame
    (the root frame holds the whole written expression) would grow ~3x per level here."""
    from rlmlab.decoding import driver, oracle

    touched = [0]
    init, extend = oracle._Match.__init__, oracle._Match.extend

    def counted_init(self, examples, frame):
        touched[0] += len(frame) * max(1, len(examples))
        init(self, examples, frame)

    def counted_extend(self, frame):
        touched[0] += (len(frame) - self.n) * max(1, len(self.examples))
        extend(self, frame)

    monkeypatch.setattr(oracle._Match, "__init__", counted_init)
    monkeypatch.setattr(oracle._Match, "extend", counted_extend)
    per_token = {}
    vocab = PAPER.vocab
    for height in (4, 5, 6):
        touched[0] = 0
        expr = PAPER.parse(_tree(height))
        (g,) = driver.generate(oracle.oracle_predictor(learner, vocab, PAPER.library), [expr], vocab, learner, library=PAPER.library)
        assert g.valid
        per_token[height] = touched[0] / PAPER.trace_stats(expr).trace_len
    assert per_token[6] < 16 and per_token[6] < 1.3 * per_token[4], per_token


# --- link targets percent-encoded ---------------------------------------------------------------

def test_the_experiment_index_links_folder_names_as_paths_never_as_urls(experiment, tmp_path):
    import re

    from rlmlab.experiments.viewer import experiment_index

    folder = tmp_path / "exp"
    shutil.copytree(experiment, folder, ignore=lambda _, names: {  # weights and data; the results stay
        n for n in names if n.endswith((".safetensors", ".npz"))
        or (n.endswith(".parquet") and n not in ("results.parquet", "traces.parquet", "metrics.parquet"))})
    (folder / "length-96").rename(folder / "javascript:alert(7)")
    page = experiment_index(folder, tmp_path / "view")
    index = (tmp_path / "view" / "index.html").read_text()
    links = re.findall(r'href="([^"]+)"', index)
    assert links == ["javascript%3Aalert%287%29/rm/eval.html"] and page is not None
    assert (tmp_path / "view" / "javascript:alert(7)" / "rm" / "eval.html").exists()


# --- export: finished runs only, and all or nothing ------------------------------------------

COMMITTED = ck.Path(__file__).resolve().parent.parent / "results"


def _whole(folder: ck.Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("resumable", [False, True])
@pytest.mark.parametrize("earlier", [False, True])
def test_a_failed_export_leaves_no_partial_folder_and_an_earlier_export_as_it_was(tmp_path, capsys, resumable,
                                                                                   earlier):
    src, dest = tmp_path / "src", tmp_path / "results" / "length-197-small"
    shutil.copytree(COMMITTED / "length-197-small", src)
    # a record file met half way through the copy that cannot be converted
    evaluation = src / "length-197" / "rm" / "eval" / "eval"
    for name in ("results.parquet", "traces.parquet"):
        (evaluation / name).unlink(missing_ok=True)
    (evaluation / "results.jsonl").write_text('{"expr": "add(1,2)", "correct": true}\n{cut short\n')
    if earlier:
        shutil.copytree(COMMITTED / "length-197-small", dest)
    before = _whole(dest.parent) if earlier else None
    err = one_line_error(capsys, ["export", str(src), str(dest)] + (["--resumable"] if resumable else []))
    assert "results.jsonl" in err
    if earlier:
        assert _whole(dest.parent) == before  # the earlier export, byte for byte, and nothing beside it
    else:
        assert not dest.parent.exists() or not any(dest.parent.iterdir())


def test_export_copies_finished_runs_only_and_names_the_others(tmp_path, capsys):
    """A run without its done marker is left out and named: for an `rlmlab run` experiment a
    done.json that `rlmlab run` did not write is no marker; in a folder of `rlmlab train` runs
    (a recipe comparison), a run whose log has no `end` record yet is still training."""
    from rlmlab.records import read_records

    experiment, recipe = tmp_path / "experiment", tmp_path / "recipe"
    shutil.copytree(COMMITTED / "length-197-small", experiment)
    (experiment / "length-197" / "cot" / "done.json").write_text("{}")
    shutil.copytree(COMMITTED / "recipe-595", recipe)
    training = recipe / "cot-b16-lr3e-3-w100"
    log = read_records(training / "metrics.parquet")
    (training / "metrics.parquet").unlink()
    (training / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log[:-1]))  # no `end` yet
    for src, run in ((experiment, "length-197/cot"), (recipe, "cot-b16-lr3e-3-w100")):
        dest = tmp_path / "exported" / src.name
        assert main(["export", str(src), str(dest)]) == 0
        err = capsys.readouterr().err
        assert f"left out 1 unfinished run(s) and the commands that planned only them: {run}" in err
        assert not (dest / run).exists()
        assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")]  # no staging folder left


# --- destinations that are links, files or hold links; summaries of the wrong shape ----------

def _copy(experiment, tmp_path):
    copy = tmp_path / "exp"
    shutil.copytree(experiment, copy, ignore=shutil.ignore_patterns(".lock"))
    return copy


@pytest.mark.parametrize("where", ["folder", "file"])
def test_report_never_writes_through_a_link(experiment, tmp_path, capsys, where):
    copy, outside = _copy(experiment, tmp_path), tmp_path / "outside"
    outside.mkdir()
    (outside / "report.json").write_text("mine")
    (copy / "report").mkdir(exist_ok=True)
    if where == "folder":
        shutil.rmtree(copy / "report")
        (copy / "report").symlink_to(outside, target_is_directory=True)
    else:
        (copy / "report" / "report.json").unlink(missing_ok=True)
        (copy / "report" / "report.json").symlink_to(outside / "report.json")
    assert "symbolic link" in one_line_error(capsys, ["report", str(copy)])
    assert [p.name for p in outside.iterdir()] == ["report.json"]
    assert (outside / "report.json").read_text() == "mine"


def test_view_and_eval_never_write_through_a_link(experiment, tmp_path, capsys):
    outside = tmp_path / "outside.html"
    outside.write_text("mine")
    view = tmp_path / "view"
    view.mkdir()
    (view / "index.html").symlink_to(outside)
    assert "symbolic link" in one_line_error(capsys, ["view", str(experiment), "--out", str(view), "--quiet"])
    data = tmp_path / "e.txt"
    data.write_text("add(1,2)\n")
    ev = tmp_path / "ev"
    ev.mkdir()
    (ev / "summary.json").symlink_to(outside)
    assert "symbolic link" in one_line_error(capsys, ["eval", "--oracle", "rm", "--data", str(data), "--out", str(ev),
                                                      "--quiet"])
    assert "symbolic link" in one_line_error(capsys, ["probe", "--oracle", "rm", "--data", str(data), "--out", str(ev),
                                                      "--quiet"])
    assert outside.read_text() == "mine"


def test_export_onto_a_file_is_refused_and_the_file_kept(experiment, tmp_path, capsys):
    dest = tmp_path / "notes"
    dest.write_text("mine")
    assert "a file, not a folder" in one_line_error(capsys, ["export", str(experiment), str(dest)])
    assert dest.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


@pytest.mark.parametrize("damage", ["binary", "deep", "a list"])
def test_export_refuses_a_damaged_json_or_commands_file_before_copying(experiment, tmp_path, capsys, damage):
    copy = _copy(experiment, tmp_path)
    body = {"binary": b"\xff\xfe\x00\x81", "deep": b"[" * (MAX_DEPTH + 5) + b"]" * (MAX_DEPTH + 5),
            "a list": b"[1, 2]\n"}[damage]
    (copy / "commands.jsonl").write_bytes(body)
    assert "commands.jsonl" in one_line_error(capsys, ["export", str(copy), str(tmp_path / "out1")])
    shutil.copy(experiment / "commands.jsonl", copy / "commands.jsonl")
    if damage != "a list":  # a summary may be any JSON; it must be JSON
        summary = next(copy.glob("*/rm/eval/summary.json"))
        summary.write_bytes(body)
        assert "summary.json" in one_line_error(capsys, ["export", str(copy), str(tmp_path / "out2")])
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()


@pytest.mark.parametrize("bins", [[{}], [{"label": [1], "ood": False, "available": 1, "sampled": 1}], "x", []])
def test_a_split_description_of_the_wrong_shape_is_one_error(experiment, tmp_path, capsys, bins):
    copy = _copy(experiment, tmp_path)
    meta = json.loads((copy / "experiment.json").read_text())
    meta["split"]["bins"] = bins
    (copy / "experiment.json").write_text(json.dumps(meta))
    assert "bins" in one_line_error(capsys, ["report", str(copy)])


@pytest.mark.parametrize("tool, entry", [
    ("probe", {"group_by": "bin", "group": "<=0.25", "n_expressions": 3, "position_rate": "x"}),
    ("probe", {"group_by": "bin", "group": [1], "n_expressions": 3, "position_rate": 0.5}),
    ("probe", {"group_by": "bin", "group": "<=0.25", "n_expressions": 3, "position_rate": math.nan}),
    ("frames", {"group_by": "ood", "group": False, "fn": "all", "seen": None, "n": 4, "rate": "x"}),
])
def test_a_probe_or_frames_summary_of_the_wrong_types_is_one_error(experiment, tmp_path, capsys, tool, entry):
    copy = _copy(experiment, tmp_path)
    key = "groups" if tool == "probe" else "rows"
    folder = next(copy.glob("*/rm")) / tool / "eval"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({key: [entry]}))
    err = one_line_error(capsys, ["report", str(copy)])
    assert f"not an `rlmlab {tool}` summary" in err


# --- reproduce -------------------------------------------------------------------------------

FIXTURE = ck.Path(__file__).parent / "fixtures" / "smoke-length"


@pytest.mark.parametrize("accuracy", ["high", math.inf, None])
def test_reproduce_checks_the_committed_report_before_the_fresh_run(tmp_path, capsys, accuracy):
    copy = _copy(FIXTURE, tmp_path)
    path = copy / "report" / "report.json"
    report = json.loads(path.read_text())
    report["rows"][0]["rm"]["accuracy"] = accuracy
    path.write_text(json.dumps(report))
    err = one_line_error(capsys, ["reproduce", str(copy), "--out", str(tmp_path / "out")])
    assert "report.json: cell rows[bin=" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("meta", [b"[1]\n", b"{not json", b""])
def test_reproduce_checks_the_checkpoints_before_copying_them(tmp_path, capsys, meta):
    best = tmp_path / "checkpoints" / "rm" / "best"
    best.mkdir(parents=True)
    (best / "checkpoint.json").write_bytes(meta)
    shutil.copy(RELEASED / "rm" / "best" / "model.safetensors", best)
    err = one_line_error(capsys, ["reproduce", str(FIXTURE), "--checkpoints", str(tmp_path / "checkpoints"),
                                  "--out", str(tmp_path / "out")])
    assert "checkpoint" in err and not (tmp_path / "out").exists()


# --- convert ---------------------------------------------------------------------------------

@pytest.mark.parametrize("left", [b"", b"\xff\xfe\n", b"[1, 2]\n"])
def test_convert_checks_a_moved_aside_results_file_before_putting_it_back(tmp_path, capsys, left):
    copy = _copy(FIXTURE, tmp_path)
    assert main(["convert", str(copy)]) == 0
    folder = next(p.parent for p in copy.rglob("results.parquet"))
    (folder / "results.jsonl.converting").write_bytes(left)
    before = _files(copy)
    assert "results.jsonl.converting" in one_line_error(capsys, ["convert", str(copy)])
    assert _files(copy) == before


def test_convert_refuses_a_results_file_without_records(tmp_path, capsys):
    copy = _copy(FIXTURE, tmp_path)
    path = next(copy.rglob("results.jsonl"))
    path.write_bytes(b"")
    before = _files(copy)
    assert "no records" in one_line_error(capsys, ["convert", str(copy)])
    assert _files(copy) == before


# --- experiment.json -------------------------------------------------------------------------

def test_a_fifo_in_place_of_experiment_json_is_refused_not_read(tmp_path, capsys):
    copy = _copy(FIXTURE, tmp_path)
    (copy / "experiment.json").unlink()
    os.mkfifo(copy / "experiment.json")  # opened for reading, it would block until a writer came
    assert "not a regular file" in one_line_error(capsys, ["report", str(copy)])


def test_rlmlab_results_names_a_fifo_experiment_json_for_what_it_is(tmp_path):
    import rlmlab.results
    from rlmlab.errors import DataError
    copy = _copy(FIXTURE, tmp_path)
    (copy / "experiment.json").unlink()
    os.mkfifo(copy / "experiment.json")
    with pytest.raises(DataError, match="not a regular file"):
        rlmlab.results.records(copy)
    (copy / "experiment.json").unlink()
    with pytest.raises(DataError, match="no experiment.json"):
        rlmlab.results.records(copy)


# --- damaged run folders: train --resume, and what a run folder holds ----------------------------

@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_checkpoint_tensor_file_that_is_not_a_regular_file_is_refused_before_hashing(tmp_path, kind):
    """Its checksum opened a FIFO, which blocks until a writer comes (a folder: an OSError)."""
    import signal

    run = _saved(tmp_path)
    path = run / "best" / "model.safetensors"
    path.unlink()
    path.mkdir() if kind == "folder" else os.mkfifo(path)

    def hung(*_):
        raise AssertionError(f"reading a checkpoint whose weights are a {kind} hangs")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        with pytest.raises(CheckpointError, match="model.safetensors: (is a folder|not a regular file)"):
            ck.load_run(run)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_train_never_writes_through_a_link_in_its_run_folder(tmp_path, capsys, pool):
    outside = tmp_path / "outside.txt"
    outside.write_text("mine")
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.json", "metrics.jsonl"):
        (run / name).symlink_to(outside)
    err = one_line_error(capsys, ["train", "--data", str(pool), "--out", str(run), "--max-steps", "1", "--preset",
                                  "tiny", "--data.val_size=10", "--data.cache_dir=", "--train.threads=1", "--quiet"])
    assert "holds a symbolic link" in err
    assert outside.read_text() == "mine" and sorted(p.name for p in run.iterdir()) == ["config.json", "metrics.jsonl"]


@pytest.mark.parametrize("damage", ["a line of garbage", "an infinite accuracy", "a folder"])
def test_resume_refuses_a_damaged_training_log_before_writing(tmp_path, capsys, pool, damage):
    """A resume rewrote metrics.jsonl dropping every line it could not read, carried an infinite
    accuracy on, or (a folder in its place) failed only once config.json was rewritten."""
    run = tmp_path / "run"
    assert main(["train", "--data", str(pool), "--out", str(run), "--max-steps", "2", "--preset", "tiny",
                 "--data.val_size=10", "--data.cache_dir=", "--train.threads=1", "--train.batch_size=4",
                 "--quiet"]) == 0
    capsys.readouterr()
    log = run / "metrics.jsonl"
    lines = log.read_text().splitlines()
    if damage == "a folder":
        log.unlink()
        log.mkdir()
    else:
        bad = "garbage{" if damage == "a line of garbage" else '{"kind": "val", "step": 1, "answer_acc": Infinity}'
        log.write_text("\n".join([lines[0], bad, *lines[1:]]) + "\n")
    before = _files(run)
    err = one_line_error(capsys, ["train", "--out", str(run), "--resume", "--max-steps", "3", "--quiet"])
    assert "metrics.jsonl" in err
    assert _files(run) == before and log.is_dir() == (damage == "a folder")


@pytest.mark.parametrize("argv", [
    ["--learner-setting=per_learner.rm.data.cache_dir=OUTSIDE"],
    ["--learner-setting", "per_learner.rm.data.cache_dir=OUTSIDE"],
    ["--learner-setting=per_view.rm.data.cache_dir=OUTSIDE"],
])
def test_reproduce_refuses_a_stored_command_that_writes_outside_its_out(tmp_path, capsys, argv):
    copy, outside = _copy(FIXTURE, tmp_path), tmp_path / "outside"
    argv = [a.replace("OUTSIDE", str(outside)) for a in argv]
    good = ["rlmlab", "run", "length", "--preset", "smoke", "--out", "x", "--learners=rm", "--threads=1"]
    (copy / "commands.jsonl").write_text(json.dumps({"argv": good}) + "\n" + json.dumps({"argv": good + argv}) + "\n")
    err = one_line_error(capsys, ["reproduce", str(copy), "--out", str(tmp_path / "out")])
    assert "commands.jsonl: line 2 sets data.cache_dir" in err
    assert not (tmp_path / "out").exists() and not outside.exists()


def test_reproduce_refuses_a_stored_command_of_an_unknown_kind_before_running_any(tmp_path, capsys):
    copy = _copy(FIXTURE, tmp_path)
    good = ["rlmlab", "run", "length", "--preset", "smoke", "--out", "x", "--learners=rm", "--threads=1"]
    (copy / "commands.jsonl").write_text(json.dumps({"argv": good}) + "\n"
                                         + json.dumps({"argv": ["rlmlab", "run", "../bogus"]}) + "\n")
    err = one_line_error(capsys, ["reproduce", str(copy), "--out", str(tmp_path / "out")])
    assert "line 2: '../bogus' is not an experiment kind" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra", [["--bogus-option=1"], ["--threads"], ["--help"]])
def test_reproduce_refuses_a_stored_command_that_does_not_parse_before_running_any(tmp_path, capsys, extra):
    copy = _copy(FIXTURE, tmp_path)
    good = ["rlmlab", "run", "length", "--preset", "smoke", "--out", "x", "--learners=rm", "--threads=1"]
    (copy / "commands.jsonl").write_text(json.dumps({"argv": good}) + "\n" + json.dumps({"argv": good + extra}) + "\n")
    assert main(["reproduce", str(copy), "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "a stored command does not parse" in captured.err, captured.err
    assert "$ rlmlab run" not in captured.out and "usage" not in captured.out  # nothing ran, no help printed
    assert not (tmp_path / "out").exists()

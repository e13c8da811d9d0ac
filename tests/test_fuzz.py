"""Fuzzing the inputs a user hands the CLI: any config value or config file, any damage to a
checkpoint (its metadata, forged or not, or its tensor files), any results file and any folder
layout under --out ends in exit status 2 and one line on stderr, never a traceback, with
nothing written; a damaged or resealed examples cache is refused on one line and rebuilt."""

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import reseal_examples_cache
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlmlab.cli import main
from rlmlab.errors import DataError
from rlmlab.learning.checkpoint import meta_digest, save_checkpoint
from rlmlab.learning.config import SECTIONS
from rlmlab.learning.examples import ExampleSet, build_examples
from rlmlab.learning.model import Transformer, preset
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

KEYS = sorted(f"{section}.{f}" for section, cls in SECTIONS.items() for f in cls.__dataclass_fields__)
VALUES = st.one_of(
    st.integers(-2**70, 2**70).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "-1", "0", "nan", "inf", "-inf", "true", "[1, 2]", "{}", "null", "rm", "window:0",
                     "[" * 5000, "1e400", "0x10", "cuda:x"]),
    st.text(max_size=30))


def _one_line_exit_2(capsys, argv) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert err.count("\n") == 1 and err.startswith(f"rlmlab {argv[0]}: error: ") and "Traceback" not in err, err


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(KEYS), value=VALUES)
def test_any_config_value_is_taken_or_refused_on_one_line(tmp_path, capsys, key, value):
    # A value the config takes still stops at the missing data file: exit 2, one line, either way.
    _one_line_exit_2(capsys, ["train", "--data", str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "run"),
                              "--max-steps", "1", f"--{key}={value}"])


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    vocab = PAPER.vocab
    torch.manual_seed(0)
    model = Transformer(preset("tiny", "rm", len(vocab)))
    save_checkpoint(run, "best", model, vocab=vocab, learner="rm", config={"model": {"preset": "tiny"}}, step=3,
                    metrics={})
    (run / "exprs.txt").write_text("add(1,2)\n")
    return run


JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
                                     st.text(max_size=10)),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=8)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["step", "learner", "model_config", "config", "vocab", "metrics", "files", "format",
                            "n_layer", "vocab_size", "block_size"]), value=JSON_VALUES)
@example(key="block_size", value=202_410_833)  # built before a shape check, a 26 GB positional table
@example(key="n_layer", value=10**9)
def test_any_damage_to_checkpoint_metadata_is_one_line(saved_run, tmp_path, capsys, key, value):
    run = tmp_path / "run"
    shutil.copytree(saved_run, run, dirs_exist_ok=True)
    meta_path = run / "best" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    if key in ("n_layer", "vocab_size", "block_size"):
        meta["model_config"][key] = value
    else:
        meta[key] = value
    meta_path.write_text(json.dumps(meta))
    code = main(["eval", str(run), "--data", str(run / "exprs.txt"), "--quiet"])
    err = capsys.readouterr().err
    if code == 0:  # a change the loader may accept (a metric, a config note): it then evaluates
        return
    assert code == 2 and err.count("\n") == 1 and err.startswith("rlmlab eval: error: "), err


# Damage to a file: cut it at a fraction of its length, or overwrite bytes from there on.
DAMAGE = st.one_of(st.tuples(st.just("truncate"), st.floats(0, 1)),
                   st.tuples(st.just("overwrite"), st.floats(0, 1), st.binary(min_size=1, max_size=16)))


def _damaged(raw: bytes, damage) -> bytes:
    at = int(damage[1] * (len(raw) - 1))
    if damage[0] == "truncate":
        return raw[:at]
    return raw[:at] + damage[2] + raw[at + len(damage[2]):]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=DAMAGE, consistent=st.booleans())
def test_any_damage_to_checkpoint_weights_is_one_line(saved_run, tmp_path, capsys, damage, consistent):
    """`consistent` rewrites the file's SHA-256 in checkpoint.json too, and the metadata digest,
    as a user who replaced the weights by hand would: the loader must then still refuse what
    does not parse, does not fit the model or is not finite."""
    run = tmp_path / "run"
    shutil.copytree(saved_run, run, dirs_exist_ok=True)
    weights = run / "best" / "model.safetensors"
    raw = weights.read_bytes()
    weights.write_bytes(bad := _damaged(raw, damage))
    if consistent:
        meta_path = run / "best" / "checkpoint.json"
        meta = json.loads(meta_path.read_text())
        meta["files"]["model.safetensors"] = hashlib.sha256(bad).hexdigest()
        meta["digest"] = meta_digest(meta)
        meta_path.write_text(json.dumps(meta))
    code = main(["eval", str(run), "--data", str(run / "exprs.txt"), "--quiet"])
    err = capsys.readouterr().err
    if code == 0:  # only weights that still parse, fit and are finite evaluate
        assert bad == raw or consistent
        return
    assert code == 2 and err.count("\n") == 1 and err.startswith("rlmlab eval: error: "), err


@pytest.fixture(scope="module")
def view_cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache")
    exprs = ["add(1,2)", "add(sum_of_squares(2,3),double(4))", "add(accum_sum(2,0),7)", "double(4)"]
    fresh = build_examples(exprs, "rm", PAPER.vocab, cache_dir=folder, task=PAPER)
    (path,) = folder.glob("*.npz")
    return exprs, fresh, path.name, path.read_bytes()


def _same(a: ExampleSet, b: ExampleSet) -> bool:
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("ids", "loss", "offsets", "source", "layout")) \
        and (a.learner, a.n_expressions, a.vocab.tokens) == (b.learner, b.n_expressions, b.vocab.tokens)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=DAMAGE)
@example(damage=("overwrite", 0.4148360205492537, b"\x00"))  # a NUL in an array header: SyntaxError in numpy
@example(damage=("overwrite", 0.4148360205492537, b"("))  # an unclosed bracket there: tokenize.TokenError
def test_any_damage_to_a_view_cache_is_refused_on_one_line_and_rebuilt(view_cache, tmp_path, damage):
    exprs, fresh, name, raw = view_cache
    folder = tmp_path / "cache"
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(_damaged(raw, damage))
    try:
        loaded = ExampleSet.load(folder / name)
    except DataError as e:
        assert "\n" not in str(e) and str(e).startswith(str(folder / name))
    else:  # the damage missed every array (bytes the zip format does not read back)
        assert _same(loaded, fresh)
    assert _same(build_examples(exprs, "rm", PAPER.vocab, cache_dir=folder, task=PAPER), fresh)
    assert _same(ExampleSet.load(folder / name), fresh)  # the damaged entry was overwritten


# --- configs, forged checkpoint metadata, learner caches, results files, folder layouts ---------

DEEP_JSON = st.integers(1, 3000).map(lambda d: "[" * d + "]" * d)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.one_of(JSON_VALUES.map(json.dumps), DEEP_JSON, st.binary(max_size=64).map(repr),
                     st.dictionaries(st.sampled_from(sorted(SECTIONS)), JSON_VALUES, max_size=3).map(json.dumps)),
       suffix=st.sampled_from([".json", ".toml"]))
def test_any_config_file_is_taken_or_refused_on_one_line(tmp_path, capsys, doc, suffix):
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # tmp_path is shared by the examples
    config = tmp_path / f"c{suffix}"
    config.write_text(doc)
    _one_line_exit_2(capsys, ["train", "--config", str(config), "--data", str(tmp_path / "missing.parquet"),
                              "--out", str(tmp_path / "run"), "--max-steps", "1"])
    assert not (tmp_path / "run").exists()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["step", "learner", "config", "vocab", "metrics", "files", "n_layer", "n_head", "n_embd",
                            "vocab_size", "block_size", "dropout"]), value=JSON_VALUES)
@example(key="n_embd", value=2 ** 40)
@example(key="files", value={})
def test_any_forged_checkpoint_metadata_is_one_line(saved_run, tmp_path, capsys, key, value):
    """Metadata edited and its digest recomputed, as a forger would: what the digest no longer
    guards, the checks behind it must."""
    run = tmp_path / "run"
    shutil.copytree(saved_run, run, dirs_exist_ok=True)
    meta_path = run / "best" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    if key in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "dropout"):
        meta["model_config"][key] = value
    else:
        meta[key] = value
    meta["digest"] = meta_digest(meta)
    meta_path.write_text(json.dumps(meta))
    out = Path(tempfile.mkdtemp(dir=tmp_path)) / "o"  # tmp_path is shared by the examples
    code = main(["eval", str(run), "--data", str(run / "exprs.txt"), "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    if code == 0:
        return
    assert code == 2 and err.count("\n") == 1 and err.startswith("rlmlab eval: error: "), err
    assert not out.exists()


def _array(dtype, shape):
    from hypothesis.extra.numpy import arrays

    return arrays(dtype, shape, elements=st.integers(0, 80) if np.dtype(dtype).kind in "iu" else None)


SHAPES = st.one_of(st.tuples(st.integers(0, 6)), st.tuples(st.integers(0, 3), st.integers(0, 4)))
DTYPES = st.sampled_from([np.uint16, np.int64, np.int32, np.bool_, np.float64])
ANY_ARRAY = st.tuples(DTYPES, SHAPES).flatmap(lambda ds: _array(*ds))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replace=st.dictionaries(st.sampled_from(["ids", "loss", "offsets", "source", "layout"]), ANY_ARRAY,
                               min_size=1, max_size=3))
def test_any_resealed_view_cache_is_refused_or_consistent(view_cache, tmp_path, replace):
    """Arrays of any shape and type, sealed with a matching SHA-256: the loader refuses them on
    one line or returns data whose arrays agree with each other."""
    _, _, name, raw = view_cache
    path = tmp_path / name
    path.write_bytes(raw)
    reseal_examples_cache(path, **replace)
    try:
        data = ExampleSet.load(path)
    except DataError as e:
        assert "\n" not in str(e)
        return
    assert data.offsets[0] == 0 and data.offsets[-1] == len(data.ids) == len(data.loss)
    assert len(data.source) == len(data.offsets) - 1 and (len(data.ids) == 0 or int(data.ids.max()) < len(data.vocab))


RESULT_LINES = st.lists(st.one_of(JSON_VALUES.map(json.dumps), DEEP_JSON, st.text(max_size=20),
                                  st.fixed_dictionaries({"expr": st.text(max_size=8), "correct": st.booleans()},
                                                        optional={"trace": JSON_VALUES, "valid": JSON_VALUES})
                                  .map(json.dumps)), max_size=5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=RESULT_LINES, summary=st.one_of(JSON_VALUES.map(json.dumps), DEEP_JSON))
def test_any_results_file_is_read_or_refused_on_one_line(tmp_path, lines, summary):
    (tmp_path / "results.jsonl").write_text("".join(line + "\n" for line in lines))
    (tmp_path / "summary.json").write_text(summary)
    _read_or_refused_on_one_line(tmp_path)


def _read_or_refused_on_one_line(folder: Path) -> None:
    """Both readers of an evaluation folder either refuse it on one line or give well-typed rows."""
    from rlmlab.experiments.viewer import read_eval_set
    from rlmlab.measuring.result_files import read_results

    for read in (read_results, read_eval_set):
        try:
            out = read(folder)
        except DataError as e:
            assert "\n" not in str(e)
            continue
        rows = out if isinstance(out, list) else out.results
        assert all(isinstance(r["expr"], str) and isinstance(r["correct"], bool) for r in rows)


RESULT_RECORDS = st.lists(st.one_of(st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3),
                                    st.fixed_dictionaries({"expr": st.text(max_size=8), "correct": st.booleans()},
                                                          optional={"trace": JSON_VALUES, "valid": JSON_VALUES})),
                          max_size=5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=RESULT_RECORDS, damage=st.one_of(st.none(), DAMAGE), which=st.sampled_from(["results", "traces"]),
       summary=st.one_of(JSON_VALUES.map(json.dumps), DEEP_JSON))
# a NUL written into a data page: the file still reads, but its text is no longer UTF-8
@example(records=[{"correct": False, "expr": "\u0800"}, {"\x1f\x1f\U00010000": [], "\U00010000": [None]}],
         damage=("overwrite", 0.0703125, b"\x00"), which="results", summary="[]")
def test_any_results_parquet_is_read_or_refused_on_one_line(tmp_path, records, damage, which, summary):
    """The Parquet twin of the test above: any records as `rlmlab eval` would store them (traces
    of any JSON value included), the file then damaged or not, read or refused on one line."""
    from rlmlab.measuring.result_files import write_rows

    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # tmp_path is shared by the examples
    try:
        write_rows(tmp_path, records)
    except ValueError:  # records the codec refuses are not written
        assert not (tmp_path / "results.parquet").exists()
        return
    target = tmp_path / f"{which}.parquet"
    if damage is not None and target.exists():
        target.write_bytes(_damaged(target.read_bytes(), damage))
    (tmp_path / "summary.json").write_text(summary)
    _read_or_refused_on_one_line(tmp_path)


MARKERS = ["experiment.json", "config.json", "metrics.jsonl", "metrics.parquet", "last/checkpoint.json",
           "best/checkpoint.json", "summary.json", "results.jsonl", "results.parquet", "done.json",
           "eval/x/summary.json"]


def _snapshot(folder):
    return {str(p.relative_to(folder)): (p.is_symlink(), p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(present=st.sets(st.sampled_from(MARKERS), max_size=4), content=st.sampled_from(["{}", "garbage", "[[[", ""]),
       link=st.booleans())
def test_any_folder_layout_is_written_into_only_when_it_holds_that_kind(tmp_path, capsys, present, content, link):
    """`eval --out` and `train --out` into a folder holding any mix of other commands' files:
    one line and the folder untouched, or (eval) an evaluation written into a folder that held
    nothing of another kind."""
    from rlmlab.safeio import folder_kind

    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # tmp_path is shared by the examples
    folder = tmp_path / "f"
    folder.mkdir()
    for rel in present:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(content)
    if link:  # eval writes only its own files: a link elsewhere in the folder is no hazard
        (tmp_path / "elsewhere").write_text("mine")
        (folder / "linked").symlink_to(tmp_path / "elsewhere")
    kind = folder_kind(folder)
    before = _snapshot(folder)
    data = tmp_path / "e.txt"
    data.write_text("add(1,2)\n")
    code = main(["eval", "--oracle", "rm", "--data", str(data), "--quiet", "--out", str(folder)])
    err = capsys.readouterr().err
    if code == 0:
        assert kind in (None, "evaluation")
    else:
        assert code == 2 and err.count("\n") == 1 and _snapshot(folder) == before, err
    before = _snapshot(folder)
    _one_line_exit_2(capsys, ["train", "--data", str(tmp_path / "missing.parquet"), "--out", str(folder),
                              "--max-steps", "1"])
    assert _snapshot(folder) == before


FIXTURE = Path(__file__).resolve().parent / "fixtures" / "smoke-length"


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(present=st.sets(st.sampled_from(MARKERS), max_size=3), content=st.sampled_from(["{}", "garbage"]),
       link=st.sampled_from([None, "experiment.json", "report", "length-96/rm/done.json"]))
@example(present=set(), content="{}", link="length-96/rm/done.json")
def test_export_writes_only_into_an_export_and_never_through_links(tmp_path, capsys, present, content, link):
    from rlmlab.safeio import folder_kind

    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # tmp_path is shared by the examples
    dest = tmp_path / "dest"
    dest.mkdir()
    for rel in present:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(content)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "mine").write_text("mine")
    if link is not None:
        (dest / link).parent.mkdir(parents=True, exist_ok=True)
        if not (dest / link).exists():
            (dest / link).symlink_to(outside / "mine" if "." in link else outside)
    kind = folder_kind(dest)
    before = _snapshot(dest)
    code = main(["export", str(FIXTURE), str(dest)])
    err = capsys.readouterr().err
    if code == 0:
        assert link is None and kind in (None, "experiment")
    else:
        assert code == 2 and err.count("\n") == 1 and _snapshot(dest) == before, err
    assert sorted(os.listdir(outside)) == ["mine"] and (outside / "mine").read_text() == "mine"

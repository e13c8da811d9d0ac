"""Fuzzing the inputs a user hands the CLI: any config value and any damage to a checkpoint
(its metadata or its tensor files) ends in exit status 2 and one line on stderr, never a
traceback; a damaged view cache is refused on one line and rebuilt."""

import hashlib
import json
import shutil

import numpy as np

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlmlab.cli import main
from rlmlab.errors import DataError
from rlmlab.learning.checkpoint import meta_digest, save_checkpoint
from rlmlab.learning.config import SECTIONS
from rlmlab.learning.model import Transformer, preset
from rlmlab.learning.views import ViewData, build_view_data
from rlmlab.task.vocab import default_vocab

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
    vocab = default_vocab()
    torch.manual_seed(0)
    model = Transformer(preset("tiny", "rm", len(vocab)))
    save_checkpoint(run, "best", model, vocab=vocab, view="rm", config={"model": {"preset": "tiny"}}, step=3,
                    metrics={})
    (run / "exprs.txt").write_text("add(1,2)\n")
    return run


JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
                                     st.text(max_size=10)),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=8)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["step", "view", "model_config", "config", "vocab", "metrics", "files", "format",
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
    fresh = build_view_data(exprs, "rm", default_vocab(), cache_dir=folder)
    (path,) = folder.glob("*.npz")
    return exprs, fresh, path.name, path.read_bytes()


def _same(a: ViewData, b: ViewData) -> bool:
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("ids", "loss", "offsets", "source", "layout")) \
        and (a.view, a.n_expressions, a.vocab.tokens) == (b.view, b.n_expressions, b.vocab.tokens)


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
        loaded = ViewData.load(folder / name)
    except DataError as e:
        assert "\n" not in str(e) and str(e).startswith(str(folder / name))
    else:  # the damage missed every array (bytes the zip format does not read back)
        assert _same(loaded, fresh)
    assert _same(build_view_data(exprs, "rm", default_vocab(), cache_dir=folder), fresh)
    assert _same(ViewData.load(folder / name), fresh)  # the damaged entry was overwritten

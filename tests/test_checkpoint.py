"""Checkpoints: safetensors + JSON, atomic, never unpickled; bad run folders are CheckpointErrors."""

import json
import os
import pickle

import pytest
import torch

import rlmlab.learning.checkpoint as ck
import rlmlab.learning.resume as resume
from rlmlab.errors import CheckpointError
from rlmlab.learning.checkpoint import load_run, save_checkpoint
from rlmlab.learning.model import Transformer, preset
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def _trained_model(seed=0):
    torch.manual_seed(seed)
    vocab = PAPER.vocab
    model = Transformer(preset("tiny", "rm", len(vocab)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.randint(0, len(vocab), (2, 9))).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt, vocab


def _save(run, which="last", seed=0, step=5):
    model, opt, vocab = _trained_model(seed)
    save_checkpoint(run, which, model, vocab=vocab, learner="rm", config={"model": {"preset": "tiny"}}, step=step,
                    metrics={"val/loss": 1.5}, optimizer=opt if which == "last" else None, trainer={"step": step})
    return model, opt


def test_round_trip(tmp_path):
    model, opt = _save(tmp_path, "last")
    _save(tmp_path, "best", step=3)
    r = load_run(tmp_path, "last")
    assert (r.learner, r.step, r.metrics, r.config) == ("rm", 5, {"val/loss": 1.5}, {"model": {"preset": "tiny"}})
    assert r.vocab == PAPER.vocab and not r.model.training
    assert r.model.lm_head.weight is r.model.wte.weight  # tying survives
    for (n, a), (_, b) in zip(model.state_dict().items(), r.model.state_dict().items()):
        assert torch.equal(a, b), n
    assert load_run(tmp_path).step == 3  # best by default
    assert sorted(os.listdir(tmp_path / "last")) == ["checkpoint.json", "model.safetensors", "optimizer.safetensors"]
    assert sorted(os.listdir(tmp_path / "best")) == ["checkpoint.json", "model.safetensors"]

    # optimizer state comes back exactly
    meta = ck.read_checkpoint_meta(tmp_path / "last")
    opt2 = torch.optim.AdamW(r.model.parameters(), lr=1e-2)
    resume.load_optimizer_state(tmp_path / "last", meta, opt2)
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert all(torch.equal(a["state"][i][k], b["state"][i][k]) for i in a["state"] for k in a["state"][i])


def test_loading_never_unpickles(tmp_path, monkeypatch):
    _save(tmp_path, "last")

    def forbidden(*a, **k):
        raise AssertionError("unpickling")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    assert load_run(tmp_path, "last").step == 5
    for name in ("model.safetensors", "optimizer.safetensors"):
        raw = (tmp_path / "last" / name).read_bytes()
        header_len = int.from_bytes(raw[:8], "little")
        json.loads(raw[8:8 + header_len])  # a safetensors header, not a pickle
    json.loads((tmp_path / "last" / "checkpoint.json").read_text())


def test_no_loader_in_the_package_can_unpickle():
    """Every way this codebase reads files from disk, by source: no pickle, no torch.load,
    numpy only with allow_pickle=False (pyarrow >= 14.0.1 for the parquet reader)."""
    import re
    from pathlib import Path

    import rlmlab

    for path in Path(rlmlab.__file__).parent.rglob("*.py"):
        code = path.read_text()
        assert not re.search(r"\bimport pickle|from pickle|\bdill\b|joblib|torch\.load\(|pd\.read_pickle", code), path
        for call in re.findall(r"np\.load\([^)]*\)", code):
            assert "allow_pickle=False" in call, (path, call)


def test_corrupt_or_missing_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="no such run folder"):
        load_run(tmp_path / "nope")
    _save(tmp_path, "last")
    with pytest.raises(CheckpointError, match=r"no 'best' checkpoint \(has: last\)"):
        load_run(tmp_path, "best")
    with pytest.raises(CheckpointError, match="which must be"):
        load_run(tmp_path, "first")
    weights = tmp_path / "last" / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-3] ^= 0xFF
    weights.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        load_run(tmp_path, "last")
    weights.unlink()
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        load_run(tmp_path, "last")
    (tmp_path / "last" / "checkpoint.json").write_text("{truncated")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_run(tmp_path, "last")


def test_a_killed_save_leaves_a_complete_checkpoint(tmp_path, monkeypatch):
    old, _ = _save(tmp_path, "last", seed=0, step=5)

    # killed while writing the new files: the old checkpoint is untouched
    real_fsync = ck._fsync

    def die_on_dir_sync(path):
        if path.name.startswith(".last.tmp"):
            raise KeyboardInterrupt
        real_fsync(path)

    monkeypatch.setattr(ck, "_fsync", die_on_dir_sync)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, "last", seed=1, step=9)
    monkeypatch.undo()
    assert load_run(tmp_path, "last").step == 5

    # killed between moving the old one aside and renaming the new one in: load finds the old one
    real_rename = os.rename
    calls = []

    def die_on_second_rename(a, b):
        calls.append(a)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_rename(a, b)

    monkeypatch.setattr(ck.os, "rename", die_on_second_rename)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, "last", seed=1, step=9)
    monkeypatch.undo()
    assert not (tmp_path / "last").exists()
    r = load_run(tmp_path, "last")
    assert r.step == 5 and torch.equal(r.model.wte.weight, old.wte.weight)

    # the next save completes and cleans up what the killed ones left
    _save(tmp_path, "last", seed=1, step=9)
    assert load_run(tmp_path, "last").step == 9
    assert sorted(os.listdir(tmp_path)) == ["last"]


@pytest.mark.parametrize("key, value, message", [
    ("files", [], "'files' should be an object, not list"),
    ("vocab", 5, "'vocab' should be a list"),
    ("vocab", [1, 2], "should list token strings"),
    ("step", "x", "'step' should be an integer"),
    ("step", True, "'step' should be an integer"),
    ("trainer", "x", "'trainer' should be an object"),
    ("files", {"../elsewhere.safetensors": "0" * 64}, "unexpected file"),
])
def test_malformed_checkpoint_metadata(tmp_path, key, value, message):
    _save(tmp_path, "last")
    meta_path = tmp_path / "last" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta[key] = value
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=message):
        load_run(tmp_path, "last")


def test_non_finite_or_misshapen_tensors_are_refused_on_load(tmp_path):
    from safetensors.torch import load_file, save_file

    model, opt = _save(tmp_path / "nan", "last")
    weights = load_file(str(tmp_path / "nan" / "last" / "model.safetensors"))
    name = next(iter(weights))
    weights[name][0] = float("nan")
    save_file(weights, str(tmp_path / "nan" / "last" / "model.safetensors"))
    meta_path = tmp_path / "nan" / "last" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta["files"]["model.safetensors"] = ck._sha256(tmp_path / "nan" / "last" / "model.safetensors")
    meta["digest"] = ck.meta_digest(meta)  # a forgery consistent down to the metadata digest
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="non-finite weights"):
        load_run(tmp_path / "nan", "last")

    _save(tmp_path / "ok", "last")
    meta = ck.read_checkpoint_meta(tmp_path / "ok" / "last")
    moments = load_file(str(tmp_path / "ok" / "last" / "optimizer.safetensors"))
    fresh = torch.optim.AdamW(_trained_model()[0].parameters(), lr=1e-2)
    key = next(k for k in moments if k.endswith("exp_avg"))
    for damaged, message in ((moments[key][..., :1].contiguous(), "does not fit this model"),
                             (torch.full_like(moments[key], float("inf")), "non-finite")):
        with pytest.raises(CheckpointError, match=message):
            resume.restore_optimizer(fresh, {**moments, key: damaged}, meta["optimizer"])

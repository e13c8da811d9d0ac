"""What a checkpoint's metadata says is checked against what the rest of it says (issue 69).

The digest of checkpoint.json detects accidents, not forgery, and format /1 has none. So a
checkpoint relabelled as /1, weights of another dtype, a learner or a model config that its
weights, its run config or the run folder's config.json contradict, and a step outside the
run's budget are each refused on one line before anything is decoded or trained. Also here:
an export that copies no link target, the examples cache's leftovers, bounds on --threads, the
warning for a split without an out-of-domain bin and the divergence message."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import one_line_error, write_as_legacy
from safetensors import safe_open
from safetensors.torch import save_file

from rlmlab.cli import main
from rlmlab.errors import CheckpointError, ConfigError, DataError, TrainingDiverged
from rlmlab.learning import checkpoint as ck
from rlmlab.learning import resume
from rlmlab.learning import step as step_module
from rlmlab.learning.config import DataSettings, ModelSettings, RunConfig, TrainConfig, apply_overrides
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

BATCH_LOSS = step_module.batch_loss  # before any test replaces it
ROOT = Path(__file__).resolve().parent.parent
RELEASED = ROOT / "rlmlab" / "released" / "paper-cpu-length-595"


def _released(tmp_path, name: str = "rm") -> Path:
    run = tmp_path / name
    shutil.copytree(RELEASED / name, run)
    return run


def _meta(ckpt: Path) -> dict:
    return json.loads((ckpt / ck.META_FILE).read_text())


def _reseal(ckpt: Path, meta: dict) -> None:
    """Write `meta` sealed with a digest recomputed: a forgery the digest cannot see."""
    meta["digest"] = ck.meta_digest(meta)
    (ckpt / ck.META_FILE).write_text(json.dumps(meta, indent=1))


def _rewrite_tensors(ckpt: Path, name: str, change) -> dict:
    """Rewrite the tensor file `name` through `change(tensors) -> tensors`, with its SHA-256 in
    the returned metadata (the caller writes it)."""
    path = ckpt / name
    with safe_open(str(path), "pt") as f:
        header, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    save_file(change(tensors), str(path), metadata=header)
    meta = _meta(ckpt)
    meta["files"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return meta


def _eval_error(capsys, tmp_path, run: Path) -> str:
    """`rlmlab eval` of `run`, which must be refused on one line with nothing written."""
    data = tmp_path / "e.txt"
    data.write_text("add(1,2)\ndouble(3)\n")
    err = one_line_error(capsys, ["eval", str(run), "--data", str(data), "--quiet", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
    return err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A finished 4-step tiny RM run (best/ and last/, config.json): copied before tampering."""
    base = tmp_path_factory.mktemp("tiny")
    assert main(["data", "pool", "--n", "120", "--quiet", "--out", str(base / "pool.parquet")]) == 0
    run = base / "run"
    assert main(["train", "--preset", "tiny", "--data", str(base / "pool.parquet"), "--out", str(run),
                 "--max-steps", "4", "--data.val_size=20", "--data.cache_dir=", "--train.eval_every=2",
                 "--train.warmup_steps=1", "--train.batch_size=4", "--train.threads=1", "--quiet"]) == 0
    return run


def _files(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _copy_run(tiny_run: Path, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    return run


# --- format /1 is read only for what it is --------------------------------------------------------

@pytest.mark.parametrize("edit", ["n_head", "learner"])
def test_a_released_checkpoint_relabelled_as_format_1_is_refused(tmp_path, capsys, edit):
    run = _released(tmp_path)
    meta = {k: v for k, v in _meta(run / "best").items() if k != "digest"} | {"format": ck.LEGACY_FORMAT}
    if edit == "n_head":
        meta["model_config"]["n_head"] = 4  # evaluated 0% instead of 100%, exit 0
    else:
        meta["view"] = "cot"
    (run / "best" / ck.META_FILE).write_text(json.dumps(meta))
    err = _eval_error(capsys, tmp_path, run)
    assert "'format' says rlmlab-checkpoint/1, but its model.safetensors was written as rlmlab-checkpoint/2" in err
    # Keeping the digest does not help: format /1 never wrote one.
    (run / "best" / ck.META_FILE).write_text(json.dumps(meta | {"digest": ck.meta_digest(meta)}))
    assert "which wrote no 'digest'" in _eval_error(capsys, tmp_path, run)


def test_a_checkpoint_as_format_1_wrote_it_loads_and_its_metadata_is_checked(tmp_path):
    run = _released(tmp_path)
    write_as_legacy(run / "best")
    legacy, released = ck.load_run(run), ck.load_run(RELEASED / "rm")
    assert (legacy.learner, legacy.step) == (released.learner, released.step)
    x = torch.randint(0, len(released.vocab), (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(legacy.model(x), released.model(x), atol=0, rtol=0)
    meta = _meta(run / "best")
    for key, value, field in (("n_head", 4, "n_head=4"), ("block_size", 4096, "block_size=4096")):
        edited = json.loads(json.dumps(meta))
        edited["model_config"][key] = value
        (run / "best" / ck.META_FILE).write_text(json.dumps(edited))
        with pytest.raises(CheckpointError, match=rf"'model_config' has {field}, but its run config "
                                                  r"\(model.preset=cpu, learner 'rm'\) makes"):
            ck.load_run(run)
    (run / "best" / ck.META_FILE).write_text(json.dumps(meta | {"view": "cot"}))
    with pytest.raises(CheckpointError, match="'learner' is 'cot', but its run config has data.learner='rm'"):
        ck.load_run(run)


# --- every tensor's dtype and shape -----------------------------------------------------------------

def test_weights_of_another_dtype_are_refused_by_eval(tmp_path, capsys):
    run = _released(tmp_path)
    meta = _rewrite_tensors(run / "best", ck.MODEL_FILE, lambda t: {k: v.to(torch.int32) for k, v in t.items()})
    _reseal(run / "best", meta)
    err = _eval_error(capsys, tmp_path, run)
    assert "model.safetensors: " in err and "is stored as I32, the model's weights are F32" in err


def test_weights_of_another_dtype_are_refused_by_resume(tiny_run, tmp_path, capsys):
    run = _copy_run(tiny_run, tmp_path)
    meta = _rewrite_tensors(run / "last", ck.MODEL_FILE, lambda t: {k: v.to(torch.int32) for k, v in t.items()})
    _reseal(run / "last", meta)
    before = _files(run)
    err = one_line_error(capsys, ["train", "--out", str(run), "--resume", "--max-steps", "6", "--quiet"])
    assert "is stored as I32, the model's weights are F32" in err
    assert _files(run) == before


@pytest.mark.parametrize("change, message", [
    (lambda t: {k: (v.to(torch.int64) if k.endswith(".step") else v) for k, v in t.items()}, "expected () torch.float32"),
    (lambda t: {**t, "state.9999.exp_avg": torch.zeros(3)}, "a tensor this model's AdamW has not (state.9999.exp_avg)"),
    (lambda t: {**t, "state.0.momentum_buffer": torch.zeros(3)}, "AdamW has not (state.0.momentum_buffer)"),
])
def test_optimizer_tensors_of_another_dtype_or_name_are_refused_by_resume(tiny_run, tmp_path, capsys, change,
                                                                         message):
    run = _copy_run(tiny_run, tmp_path)
    _reseal(run / "last", _rewrite_tensors(run / "last", ck.OPTIM_FILE, change))
    before = _files(run)
    err = one_line_error(capsys, ["train", "--out", str(run), "--resume", "--max-steps", "6", "--quiet"])
    assert message in err
    assert _files(run) == before


def test_a_weights_only_resume_point_is_sealed_and_its_optimizer_claims_are_checked(tiny_run, tmp_path, capsys):
    run = _copy_run(tiny_run, tmp_path)
    with pytest.raises(CheckpointError, match="not a resume point"):
        resume.drop_optimizer(run / "best")
    resume.drop_optimizer(run / "last")
    assert sorted(p.name for p in (run / "last").iterdir()) == [ck.META_FILE, ck.MODEL_FILE]
    meta = ck.read_checkpoint_meta(run / "last")  # resealed: its digest holds
    assert meta["optimizer_dropped"] is True and "optimizer" not in meta and ck.OPTIM_FILE not in meta["files"]
    model = ck.load_run(run, "last").model
    assert resume.load_optimizer_state(run / "last", meta, torch.optim.AdamW(model.parameters())) is False
    # Saying the optimizer was dropped while still naming its file is not a weights-only point.
    forged = _meta(run / "last") | {"optimizer": {}}
    forged["files"] = {**forged["files"], ck.OPTIM_FILE: "0" * 64}
    _reseal(run / "last", forged)
    before = _files(run)
    err = one_line_error(capsys, ["train", "--out", str(run), "--resume", "--max-steps", "6", "--quiet"])
    assert "optimizer.safetensors is missing" in err
    assert _files(run) == before


# --- the learner against the weights and the run's config ---------------------------------------------

@pytest.mark.parametrize("name, learner, run_config, message", [
    ("rm", "cot", False, "'learner' is 'cot', but its run config has data.learner='rm'"),
    ("rm", "window:8", False, "'learner' is 'window:8', but its run config has data.learner='rm'"),
    # the run config edited too: the preset makes CoT a table of 4,096 positions, the weights hold 512
    ("rm", "cot", True, "'model_config' has block_size=512, but its run config (model.preset=cpu, learner 'cot') "
                        "makes model.block_size=4096"),
    ("cot", "rm", True, "'model_config' has block_size=4096, but its run config (model.preset=cpu, learner 'rm') "
                        "makes model.block_size=512"),
    # window:8 has RM's sizes: the run folder's config.json still says what the run was
    ("rm", "window:8", True, "config.json: data.learner is 'rm', but"),
])
def test_a_resealed_learner_is_checked_against_the_weights_and_the_run_config(tmp_path, capsys, name, learner,
                                                                              run_config, message):
    run = _released(tmp_path, name)
    meta = _meta(run / "best")
    meta["view"] = learner
    if run_config:
        meta["config"]["data"]["view"] = learner
    _reseal(run / "best", meta)
    assert message in _eval_error(capsys, tmp_path, run)


def test_the_run_folders_config_json_must_make_the_checkpoints_model(tmp_path):
    run = _released(tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["model"]["n_head"] = 4
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json: \(model.preset=cpu, learner 'rm'\) makes "
                                              r"model.n_head=4, but .* holds a model with n_head=8"):
        ck.load_run(run)
    (run / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="config.json: not a run configuration"):
        ck.load_run(run)


def test_the_model_config_and_the_preset_sizes_of_a_resealed_checkpoint_must_agree(tmp_path, capsys):
    run = _released(tmp_path)
    meta = _meta(run / "best")
    meta["model_config"]["n_head"] = 4  # the same tensor shapes: only the run config can tell
    _reseal(run / "best", meta)
    assert "'model_config' has n_head=4, but its run config (model.preset=cpu, learner 'rm') makes model.n_head=8" in \
        _eval_error(capsys, tmp_path, run)


# --- the step ------------------------------------------------------------------------------------

@pytest.mark.parametrize("step", [10**30, -5, 6001])
def test_a_resealed_step_outside_the_runs_budget_is_refused(tmp_path, capsys, step):
    run = _released(tmp_path)
    meta = _meta(run / "best")
    meta["step"] = step
    _reseal(run / "best", meta)
    assert f"'step' is {step}, not a step of its run (0 to train.max_steps=6,000)" in _eval_error(capsys, tmp_path, run)


def test_a_last_checkpoints_step_is_its_trainer_states(tiny_run, tmp_path):
    run = _copy_run(tiny_run, tmp_path)
    meta = _meta(run / "last")
    meta["step"] = 2
    _reseal(run / "last", meta)
    with pytest.raises(CheckpointError, match="'step' is 2, its trainer state's step 4"):
        ck.load_run(run, "last")


def test_resuming_below_the_step_reached_is_refused(tiny_run, tmp_path, capsys):
    run = _copy_run(tiny_run, tmp_path)
    before = _files(run)
    err = one_line_error(capsys, ["train", "--out", str(run), "--resume", "--max-steps", "2", "--quiet"])
    assert "train.max_steps=2 is below the step the run has reached (4)" in err
    assert _files(run) == before


# --- export copies no link target ---------------------------------------------------------------------

def test_export_follows_no_symbolic_link_and_names_those_it_skipped(tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "results" / "depth-5-small", src)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for export")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.json").write_text("{}")
    (src / "hostname").symlink_to(secret)
    (src / "depth-5" / "rm" / "notes").symlink_to(elsewhere, target_is_directory=True)
    (src / "inside.md").symlink_to(src / "README.md")
    assert main(["export", str(src), str(tmp_path / "dest")]) == 0
    err = capsys.readouterr().err
    assert "skipped 3 symbolic link(s), neither followed nor copied: depth-5/rm/notes, hostname, inside.md" in err
    copied = {p.relative_to(tmp_path / "dest") for p in (tmp_path / "dest").rglob("*")}
    assert Path("hostname") not in copied and Path("depth-5/rm/notes") not in copied
    assert Path("inside.md") not in copied and Path("README.md") in copied
    assert not any(p.is_file() and p.read_bytes() == b"not for export" for p in (tmp_path / "dest").rglob("*"))


def test_reevaluate_copies_no_file_from_outside_its_trees(tmp_path):
    from rlmlab.experiments.reproduce import reevaluate

    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(RELEASED, checkpoints)
    outside = tmp_path / "weights.safetensors"
    shutil.move(checkpoints / "rm" / "best" / "model.safetensors", outside)
    (checkpoints / "rm" / "best" / "model.safetensors").symlink_to(outside)
    with pytest.raises(DataError, match="model.safetensors: a symbolic link to .*, outside"):
        reevaluate(ROOT / "results" / "length-595-paper-cpu", checkpoints, tmp_path / "out", sample=1)
    assert not (tmp_path / "out").exists()


# --- the examples cache -----------------------------------------------------------------------------

def test_a_cache_entry_that_is_a_folder_is_refused_before_building(tmp_path):
    from rlmlab.learning.example_cache import cache_key
    from rlmlab.learning.examples import build_examples

    exprs, vocab = ["add(1,2)", "double(3)"], PAPER.vocab
    cache = tmp_path / "cache"
    (cache / f"rm-{cache_key(exprs, 'rm', vocab, PAPER)}.npz").mkdir(parents=True)
    with pytest.raises(DataError, match="data.cache_dir: .*npz is a folder"):
        build_examples(exprs, "rm", vocab, cache_dir=cache, task=PAPER)
    assert sorted(p.name for p in cache.iterdir() if not p.is_dir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(DataError, match="data.cache_dir: .*file is not a folder"):
        build_examples(exprs, "rm", vocab, cache_dir=tmp_path / "file", task=PAPER)


def test_a_failed_cache_save_leaves_no_temporary_file(tmp_path, monkeypatch):
    from rlmlab.learning.examples import build_examples

    data = build_examples(["add(1,2)", "double(3)"], "rm", PAPER.vocab, task=PAPER)

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError):
        data.save(tmp_path / "c" / "x.npz")
    assert list((tmp_path / "c").iterdir()) == []


# --- --threads ----------------------------------------------------------------------------------------

def test_threads_have_an_upper_bound(tmp_path, capsys, monkeypatch):
    with pytest.raises(ConfigError, match="train.threads must be at most 1024"):
        apply_overrides(RunConfig(), ["train.threads=100000"])
    assert apply_overrides(RunConfig(), ["train.threads=1024"]).train.threads == 1024
    import rlmlab.cli.run_cmd as run_cmd

    monkeypatch.setattr(run_cmd, "run_experiment", lambda *a, **k: pytest.fail("an experiment was started"))
    err = one_line_error(capsys, ["run", "length", "--preset", "smoke", "--out", str(tmp_path / "x"),
                                  "--threads", "100000", "--quiet"])
    assert "--threads must lie in [1, 1024], got 100000" in err and not (tmp_path / "x").exists()
    for command in (["eval", "--oracle", "rm", "--data", str(tmp_path / "e.txt")], ["probe", "--oracle", "rm", "--data", str(tmp_path / "e.txt")]):
        assert "--threads must be at most 1024" in one_line_error(capsys, command + ["--threads", "5000"])


# --- a split without an out-of-domain bin -----------------------------------------------------------

def test_a_split_without_an_out_of_domain_bin_is_warned_about(tmp_path, capsys):
    from rlmlab.experiments.kinds import get_kind
    from rlmlab.experiments.presets import get_preset

    preset = get_preset("smoke").with_overrides(pool_n=300)
    jobs = get_kind("length").plan(preset, tmp_path / "far", ["rm"], progress=False, threshold=100_000, task=PAPER)
    assert jobs
    err = capsys.readouterr().err
    assert "warning: no expression of the pool lies above the threshold 100000" in err
    assert "in-domain expressions and no out-of-domain bin" in err and err.count("\n") == 1
    get_kind("length").plan(preset, tmp_path / "near", ["rm"], progress=False, threshold=96, task=PAPER)
    assert "warning" not in capsys.readouterr().err


# --- the divergence message ---------------------------------------------------------------------------

def _diverging_run(run, monkeypatch, poisoned_from: int, eval_every: int) -> str:
    """The error of a tiny run whose loss is NaN from the `poisoned_from`-th batch_loss call on."""
    import rlmlab.learning.train as tr_mod
    from rlmlab.learning.examples import build_examples

    exprs = ["add(1,2)", "double(3)", "square(2)", "max(1,4)", "add(double(1),3)", "min(2,5)"] * 4
    tr, va = (build_examples(e, "rm", PAPER.vocab, task=PAPER) for e in (exprs, exprs[:4]))
    calls = {"n": 0}

    def poisoned(fwd, batch, device):
        loss, n = BATCH_LOSS(fwd, batch, device)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] >= poisoned_from else loss), n

    monkeypatch.setattr(step_module, "batch_loss", poisoned)
    cfg = RunConfig(ModelSettings(preset="tiny"), DataSettings(learner="rm", row_len=64, cache_dir=""),
                    TrainConfig(max_steps=12, warmup_steps=1, eval_every=eval_every, log_every=1, batch_size=4))
    with pytest.raises(TrainingDiverged) as e:
        tr_mod.train(cfg, tr, va, run, task=PAPER, progress=False, echo=lambda s: None)
    return str(e.value)


def test_the_divergence_message_says_whether_there_is_a_checkpoint_to_resume_from(tmp_path, monkeypatch):
    message = _diverging_run(tmp_path / "early", monkeypatch, poisoned_from=2, eval_every=10)
    assert not (tmp_path / "early" / "last").exists()
    assert "non-finite training loss" in message and "no checkpoint was saved before it" in message
    assert "resume" not in message
    # batch_loss calls: steps 1 and 2, the validation at step 2 (checkpoints saved), then step 3
    message = _diverging_run(tmp_path / "late", monkeypatch, poisoned_from=4, eval_every=2)
    assert (tmp_path / "late" / "last").exists()
    assert "the last good checkpoint is kept: lower train.lr or resume from it" in message

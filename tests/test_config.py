"""Configs: overrides parse to the field's type; unknown keys and wrong types are one-line ConfigErrors."""

import json

import pytest

from rlmlab.cli import build_parser
from rlmlab.cli.train_cmd import resolve_config
from rlmlab.errors import ConfigError
from rlmlab.learning.config import (
    RunConfig,
    TrainConfig,
    apply_overrides,
    field_docs,
    load_config_file,
)


def test_defaults_are_the_papers():
    t = TrainConfig()
    assert (t.lr, t.betas, t.weight_decay, t.batch_size, t.grad_clip, t.warmup_steps) == \
        (1e-3, (0.9, 0.99), 0.1, 64, 1.0, 2000)


def test_overrides_parse_to_the_field_type():
    cfg = apply_overrides(RunConfig(), ["train.lr=3e-4", "--train.betas=0.9,0.95", "train.max_steps=100",
                                        "train.compile=true", "model.n_layer=4", "data.learner=cot",
                                        "train.patience=none", "train.weight_decay=0", "data.cache_dir="])
    assert cfg.train.lr == 3e-4 and cfg.train.betas == (0.9, 0.95) and cfg.train.max_steps == 100
    assert cfg.train.compile is True and cfg.model.n_layer == 4 and cfg.data.learner == "cot"
    assert cfg.train.patience is None and cfg.train.weight_decay == 0.0 and isinstance(cfg.train.weight_decay, float)
    assert cfg.data.cache_dir == "" and cfg.data.resolved_cache_dir() is None
    assert apply_overrides(RunConfig(), {"train.betas": "[0.8, 0.9]"}).train.betas == (0.8, 0.9)


@pytest.mark.parametrize("override, message", [
    ("train.lrr=1", "unknown config key 'train.lrr'"),
    ("optim.lr=1", "unknown config key 'optim.lr'"),
    ("train.lr=fast", "train.lr: expected float, got 'fast'"),
    ("train.max_steps=1.5", "train.max_steps: expected int or null"),
    ("train.batch_size=true", "train.batch_size: expected int"),
    ("train.compile=maybe", "train.compile: expected bool"),
    ("train.betas=0.9", "train.betas: expected pair of floats"),
    ("train.lr=-1", "train.lr must be > 0"),
    ("train.lr", "must look like section.key=value"),
    ("model.preset=huge", "unknown preset 'huge'"),
    ("data.learner=window", "unknown learner 'window'"),
    ("train.device=tpu", "train.device must be"),
])
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")) as e:
        apply_overrides(RunConfig(), [override])
    assert "\n" not in str(e.value)


def test_config_files_json_and_toml(tmp_path):
    config = {"train": {"lr": 5e-4, "betas": [0.9, 0.98]}, "model": {"preset": "tiny"}}
    (tmp_path / "a.json").write_text(json.dumps(config))
    cfg = load_config_file(tmp_path / "a.json")
    assert cfg.train.lr == 5e-4 and cfg.train.betas == (0.9, 0.98) and cfg.model.preset == "tiny"
    (tmp_path / "b.toml").write_text('[train]\nwarmup_steps = 100\nmax_minutes = 5\n[data]\nview = "cot"\n')
    cfg = load_config_file(tmp_path / "b.toml")
    assert cfg.train.warmup_steps == 100 and cfg.train.max_minutes == 5.0 and cfg.data.learner == "cot"
    (tmp_path / "c.json").write_text(json.dumps({"train": {"learning_rate": 1}}))
    with pytest.raises(ConfigError, match="unknown config key 'train.learning_rate'"):
        load_config_file(tmp_path / "c.json")
    (tmp_path / "d.json").write_text(json.dumps({"train": {"warmup_steps": "10"}}))
    with pytest.raises(ConfigError, match="train.warmup_steps: expected int, got '10'"):
        load_config_file(tmp_path / "d.json")
    (tmp_path / "e.toml").write_text("[train\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config_file(tmp_path / "e.toml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config_file(tmp_path / "missing.json")


def test_round_trip_through_json():
    cfg = apply_overrides(RunConfig(), ["train.betas=0.8,0.9", "model.dropout=0.1"])
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_cli_precedence(tmp_path):
    (tmp_path / "f.json").write_text(json.dumps({"train": {"lr": 5e-4, "max_steps": 7}, "data": {"learner": "cot"}}))
    args = build_parser().parse_args(["train", "--out", str(tmp_path / "run"), "--config", str(tmp_path / "f.json"),
                                      "--train.lr=2e-4", "--learner", "rm", "--train.max_steps", "9", "--max-steps", "11"])
    cfg = resolve_config(args)
    assert cfg.train.lr == 2e-4 and cfg.data.learner == "rm" and cfg.train.max_steps == 11
    args = build_parser().parse_args(["train", "--out", str(tmp_path / "run")])
    with pytest.raises(ConfigError, match="no stopping rule"):
        resolve_config(args)


def test_a_recipe_is_what_its_experiment_trains_the_learner_with(tmp_path):
    """`train --recipe` starts from the settings `rlmlab run --preset` gives the learner's jobs on a
    threshold split (the same `run_config`), the command's data, config file and flags over it."""
    from rlmlab.experiments.presets import get_preset

    for learner in ("cot", "rm", "window:8"):
        args = build_parser().parse_args(["train", "--out", str(tmp_path / "run"), "--recipe", "paper-cpu",
                                          "--learner", learner, "--data", "t.parquet"])
        planned = get_preset("paper-cpu").run_config(learner, "t.parquet", None)
        assert resolve_config(args) == planned, learner
    cot = resolve_config(build_parser().parse_args(["train", "--out", "x", "--recipe", "paper-cpu", "--learner", "cot"]))
    assert (cot.model.preset, cot.train.batch_size, cot.train.lr, cot.train.max_steps) == ("cpu", 16, 3e-3, 24_000)
    (tmp_path / "f.json").write_text(json.dumps({"train": {"batch_size": 8}}))
    args = build_parser().parse_args(["train", "--out", "x", "--recipe", "paper-cpu", "--learner", "cot", "--config",
                                      str(tmp_path / "f.json"), "--train.lr=1e-3", "--max-steps", "50", "--model", "tiny"])
    cfg = resolve_config(args)
    assert (cfg.train.batch_size, cfg.train.lr, cfg.train.max_steps, cfg.model.preset) == (8, 1e-3, 50, "tiny")
    assert cfg.train.min_lr_ratio == 0.01 and cfg.train.warmup_steps == 100  # the rest stays the recipe's
    args = build_parser().parse_args(["train", "--out", "x", "--recipe", "paper-cpu", "--resume"])
    with pytest.raises(ConfigError, match="a resumed run keeps its own"):
        resolve_config(args)
    # The recipe is the learner's: a config file or override that trains another learner is refused.
    (tmp_path / "cot.json").write_text(json.dumps({"data": {"learner": "cot"}}))
    for extra in (["--config", str(tmp_path / "cot.json")], ["--data.learner=cot"]):
        args = build_parser().parse_args(["train", "--out", "x", "--recipe", "paper-cpu", *extra])
        with pytest.raises(ConfigError, match="taken for learner rm, but the settings train cot: give --learner cot"):
            resolve_config(args)


def test_train_preset_is_the_old_spelling_of_model():
    new = build_parser().parse_args(["train", "--out", "x", "--model", "tiny"])
    old = build_parser().parse_args(["train", "--out", "x", "--preset", "tiny"])
    assert new.model == old.model == "tiny"


def test_every_field_is_documented():
    from dataclasses import fields

    from rlmlab.learning.config import SECTIONS

    for cls in SECTIONS.values():
        docs = field_docs(cls)
        assert all(docs.get(f.name) for f in fields(cls)), cls.__name__

"""The experiment kinds, one module each, behind `ExperimentKind` (`base.py`)."""

from __future__ import annotations

from pathlib import Path

from rlmlab.errors import ConfigError, DataError
from rlmlab.experiments import folder
from rlmlab.experiments.kinds.base import ExperimentKind
from rlmlab.experiments.kinds.iid import IIDSweep
from rlmlab.experiments.kinds.isolation import IsolationComparison
from rlmlab.experiments.kinds.recipe import RecipeComparison
from rlmlab.experiments.kinds.scale import ModelSizeComparison
from rlmlab.experiments.kinds.shortcuts import ShortcutSuite
from rlmlab.experiments.kinds.sweep import ThresholdSweep
from rlmlab.experiments.kinds.threshold import ThresholdSplit

KINDS: dict[str, ExperimentKind] = {k.name: k for k in (
    ThresholdSplit("length"), ThresholdSplit("depth"), ThresholdSweep(), IIDSweep(), ShortcutSuite(),
    RecipeComparison(), ModelSizeComparison(), IsolationComparison())}
RUNNABLE = tuple(name for name, k in KINDS.items() if k.runnable)
"""The kinds `rlmlab run` plans."""


def get_kind(name: str) -> ExperimentKind:
    if name not in KINDS:
        raise ConfigError(f"unknown experiment {name!r} (have: {', '.join(KINDS)})")
    return KINDS[name]


def read_experiment(out: Path) -> dict:
    """An experiment folder's `experiment.json`, checked against its kind."""
    meta = folder.read_experiment_json(out)
    path = out / "experiment.json"
    if meta["kind"] not in KINDS:
        raise DataError(f"{path}: not an experiment description (its 'kind' should be one of "
                        f"{', '.join(KINDS)})")
    KINDS[meta["kind"]].check_meta(meta, path)
    return meta


__all__ = ["KINDS", "RUNNABLE", "ExperimentKind", "get_kind", "read_experiment"]

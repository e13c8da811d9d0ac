"""`Job`: the unit an experiment is split into, as the kinds plan it (`rlmlab.experiments.run_job`
runs it, here or on a Ray cluster through `rlmlab.experiments.cluster`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Job:
    """Train one learner on one data set, then evaluate it on named evaluation sets."""

    name: str
    """Folder of the job inside the experiment folder (e.g. "length-197", "iid-N1000-s0")."""
    learner: str
    """The learner: "rm", "cot" or any learner of `rlmlab train --learner`, optionally with a
    position encoding ("cot@rope": learner cot, `model.positions=rope`); also its folder's name."""
    train: str
    """Training expressions (parquet)."""
    val: str
    """Validation expressions (parquet)."""
    evals: dict
    """{set name: parquet path}; extra columns of the file (bin, signal, ...) go into each result."""
    settings: dict
    """Typed run settings by dotted key (`train.lr`: 3e-3, `model.preset`: "cpu", ...), the keys of
    `rlmlab train --section.key=value`."""
    eval_batch: int = 64
    """Expressions decoded at once."""
    runaway_factor: int | None = None
    """The evaluation's `Limits.runaway_factor` (None: the driver's default)."""

    def run_dir(self, out: Path) -> Path:
        return out / self.name / self.learner

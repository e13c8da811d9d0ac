"""`Job`: the unit an experiment is split into, as the kinds plan it (`rlmlab.experiments.run_job`
runs it, here or on a Ray cluster through `rlmlab.experiments.cluster`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlmlab.learning.config import RunConfig


@dataclass(frozen=True)
class Job:
    """Train one learner on one data set, then evaluate it on named evaluation sets."""

    name: str
    """Folder of the job inside the experiment folder (e.g. "length-197", "iid-N1000-s0")."""
    learner: str
    """The learner as the command named it: "rm", "cot" or any learner of `rlmlab train
    --learner`, optionally with a position encoding ("cot@rope"); its run folder's name. What it
    means for training is already in `config` (`data.learner`, `model.positions`)."""
    config: RunConfig | None
    """The run's whole specification, built once by the experiment's preset
    (`ExperimentPreset.run_config`) and passed down unchanged; its data section names
    the training and validation files. None: the run is finished and only evaluated
    (`rlmlab reproduce`); it is refused if it is not."""
    evals: dict
    """{set name: parquet path}; extra columns of the file (bin, signal, ...) go into each result."""
    eval_batch: int = 64
    """Expressions decoded at once."""
    runaway_factor: int | None = None
    """The evaluation's `Limits.runaway_factor` (None: the driver's default)."""

    def run_dir(self, out: Path) -> Path:
        return out / self.name / self.learner

    @property
    def data_files(self) -> list[str]:
        """Every data file the job reads: training, validation and evaluation sets."""
        trained = [self.config.data.train, self.config.data.val] if self.config is not None else []
        return [f for f in trained if f] + list(self.evals.values())

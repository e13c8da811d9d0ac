"""Optional TensorBoard logging (`train.tensorboard`): the records of `metrics.jsonl`, as scalars
in the run folder's `tb/`, for `tensorboard --logdir runs/`.

metrics.jsonl stays the record that reports read; the event files only mirror it, record by
record, as it is written. Needs the `tensorboard` package (`pip install "rlmlab[tensorboard]"`),
which rlmlab does not otherwise depend on.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from rlmlab.errors import ConfigError

TB_DIR = "tb"
"""Folder of the event files inside the run folder."""


def require_tensorboard() -> None:
    """A one-line ConfigError when the tensorboard package is missing (checked before a run
    writes anything)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("train.tensorboard needs the tensorboard package: pip install \"rlmlab[tensorboard]\"")


def scalars(record: dict) -> list[tuple[str, float]]:
    """The (tag, value) pairs a metrics.jsonl record gives: every finite number but its step, tagged
    `<kind>/<key>` (`train/loss`, `val/answer_acc`, ...). Flags (`best`), text and nested
    values are left out; they stay in metrics.jsonl."""
    kind = record.get("kind", "metrics")
    return [(f"{kind}/{key}", float(value)) for key, value in record.items()
            if key not in ("kind", "step") and isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)]


class TensorBoardLog:
    """Writes each record's `scalars` at its step. A resumed run drops the events logged after
    `resume_step` (a run killed after its last save logged steps it will redo), as metrics.jsonl does."""

    def __init__(self, log_dir: Path, resume_step: int | None = None, writer_class=None):
        if writer_class is None:
            require_tensorboard()
            from torch.utils.tensorboard import SummaryWriter as writer_class
        self.writer = writer_class(str(log_dir), purge_step=None if resume_step is None else resume_step + 1)

    def write(self, record: dict) -> None:
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        for tag, value in scalars(record):
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()

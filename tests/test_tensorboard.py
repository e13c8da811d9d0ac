"""Optional TensorBoard logging: the training log's records mirrored as scalars. The tensorboard
package is an optional extra, so the writer is replaced by a recorder here; what is tested is the
record-to-scalar mapping, the wiring into training and resume, and the error without the package."""

import functools
import importlib.util
import math

import pytest

import rlmlab.learning.train as train_module
from rlmlab.cli import main
from rlmlab.learning.tensorboard import TB_DIR, TensorBoardLog, scalars
from rlmlab.runlog import read_metrics
from rlmlab.task.pool import build_pool, write_pool
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


class RecordingWriter:
    """Stands in for torch.utils.tensorboard.SummaryWriter."""

    opened: list = []

    def __init__(self, log_dir, purge_step=None):
        self.log_dir, self.purge_step, self.points, self.closed = log_dir, purge_step, [], False
        RecordingWriter.opened.append(self)

    def add_scalar(self, tag, value, step):
        self.points.append((tag, value, step))

    def close(self):
        self.closed = True


def test_scalars_of_a_record():
    record = {"kind": "val", "step": 300, "loss": 0.25, "answer_acc": 1, "best": True, "note": "x",
              "nested": {"a": 1}, "bad": math.nan, "inf": -math.inf, "val_s": 1.5}
    assert scalars(record) == [("val/loss", 0.25), ("val/answer_acc", 1.0), ("val/val_s", 1.5)]
    assert scalars({"kind": "end", "step": 9, "reason": "max_steps"}) == []


def test_a_record_without_an_integer_step_is_not_plotted():
    log = TensorBoardLog("unused", writer_class=RecordingWriter)
    for step in (None, "3", 2.5, True):
        log.write({"kind": "train", "step": step, "loss": 1.0})
    log.write({"kind": "train", "step": 4, "loss": 1.0})
    assert log.writer.points == [("train/loss", 1.0, 4)]


@pytest.fixture
def recorded(monkeypatch):
    RecordingWriter.opened = []
    monkeypatch.setattr(train_module, "TensorBoardLog", functools.partial(TensorBoardLog, writer_class=RecordingWriter))
    monkeypatch.setattr(train_module, "require_tensorboard", lambda: None)
    return RecordingWriter.opened


def _train_args(tmp_path, *extra):
    pool = tmp_path / "pool.parquet"
    if not pool.exists():
        write_pool(build_pool(120, 5, workers=1, task=PAPER), pool)
    return ["train", "--learner", "cot", "--preset", "tiny", "--data", str(pool), "--out", str(tmp_path / "run"),
            "--data.val_size=20", "--data.cache_dir=", "--data.row_len=256", "--train.eval_every=2",
            "--train.warmup_steps=2", "--train.batch_size=8", "--train.log_every=1", "--quiet", *extra]


def _expected(records):
    return [(tag, value, r["step"]) for r in records for tag, value in scalars(r)]


def test_training_mirrors_every_record_and_resume_purges_redone_steps(tmp_path, recorded, one_torch_thread):
    assert main(_train_args(tmp_path, "--max-steps", "4", "--train.tensorboard=true")) == 0
    run = tmp_path / "run"
    lines = read_metrics(run)
    (writer,) = recorded
    assert writer.log_dir == str(run / TB_DIR) and writer.purge_step is None and writer.closed
    assert writer.points == _expected(lines)
    assert {"train/loss", "train/lr", "val/loss"} <= {tag for tag, _, _ in writer.points}
    # Resumed (the setting comes back from the checkpoint): events after the saved step are dropped.
    assert main(["train", "--out", str(run), "--resume", "--max-steps", "6", "--quiet"]) == 0
    resumed = recorded[1]
    assert resumed.purge_step == 5 and resumed.closed
    assert resumed.points == _expected(read_metrics(run)[len(lines):])


def test_off_by_default(tmp_path, recorded, one_torch_thread):
    assert main(_train_args(tmp_path, "--max-steps", "2")) == 0
    assert recorded == [] and not (tmp_path / "run" / TB_DIR).exists()


def test_without_the_package_the_run_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    assert main(_train_args(tmp_path, "--max-steps", "2", "--train.tensorboard=true")) == 2
    err = capsys.readouterr().err
    assert "needs the tensorboard package" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()

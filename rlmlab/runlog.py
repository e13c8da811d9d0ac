"""A run's training log: `metrics.jsonl` while the run trains (one JSON record per line,
appended and flushed as written), `metrics.parquet` once the run is finished and converted
(`rlmlab convert`, `rlmlab export`). `MetricsLog` writes it; readers take either; no model code.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.journal import commit, staged
from rlmlab.records import read_records, write_records
from rlmlab.safeio import first_file, parse_json, parse_jsonl_objects, read_bytes, shorten

METRICS = "metrics.parquet"
LEGACY_METRICS = "metrics.jsonl"
# Reasons a run stops without finishing: it resumes from its `last` checkpoint when run again.
UNFINISHED = ("interrupted", "time_limit")


def metrics_file(run_dir: str | Path) -> Path | None:
    """The run's training log (the live JSON lines first: a run that trains on after a
    conversion appends there), or None."""
    return first_file(run_dir, (LEGACY_METRICS, METRICS))


def has_metrics(run_dir: str | Path) -> bool:
    return metrics_file(run_dir) is not None


def read_jsonl_log(path: Path) -> list[dict]:
    """The records of a metrics.jsonl; a line cut short by a killed run is skipped."""
    recs = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = parse_json(line, str(path))
        except DataError:
            continue
        if isinstance(rec, dict):
            recs.append(rec)
    return recs


def _step(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _amount(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _fraction(v) -> bool:
    return _amount(v) and v <= 1


# The fields of a training record that reports compute with, and what each must hold where a
# record has it: an accuracy of +inf would mark a learner fitted, a step of text breaks a table.
FIELDS = {"kind": (lambda v: isinstance(v, str), "text"), "step": (_step, "a whole number of steps, at least 0"),
          **{k: (_fraction, "a finite number in [0, 1]") for k in ("answer_acc", "token_acc", "answer_valid",
                                                                     "example_acc")},
          **{k: (_amount, "a finite number, at least 0") for k in ("loss", "elapsed_s", "cpu_s", "val_s", "tokens",
                                                                   "epoch")}}


def check_metrics(records: list[dict], path: Path) -> list[dict]:
    """`records`, each checked for the types and ranges of `FIELDS`."""
    for i, r in enumerate(records, 1):
        for key, (ok, what) in FIELDS.items():
            if key in r and not ok(r[key]):
                raise DataError(f"{path}: record {i}: '{key}' should be {what}, got {shorten(repr(r[key]))}")
    return records


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run's training log, checked (`check_metrics`); [] when it has none, or
    while a run that has just started has logged nothing yet. A metrics.parquet, written once a
    run has finished, without records is an error: a finished run logged its steps."""
    path = metrics_file(run_dir)
    if path is None:
        return []
    if path.suffix == ".jsonl":
        return check_metrics(read_jsonl_log(path), path)
    records = read_records(path)
    if not records:
        raise DataError(f"{path}: no records (a finished run's log holds one per logged step)")
    return check_metrics(records, path)


def training_finished(run_dir: str | Path) -> bool:
    """Whether a run's log ends with its `end` record for a reason that stops it for good: the
    mark of a finished `rlmlab train` run (an `rlmlab run` job writes done.json besides)."""
    records = read_metrics(run_dir)
    return bool(records) and records[-1].get("kind") == "end" and records[-1].get("reason") not in UNFINISHED


def convert_metrics(run_dir: str | Path) -> bool:
    """Replace a run's metrics.jsonl by metrics.parquet holding the same records, as one
    change a kill cannot cut in half (`journal`). Every line must be a JSON object, or nothing
    changes: only a last line that a killed run cut short, which no reader counts, is left
    out. Returns whether it converted."""
    run_dir = Path(run_dir)
    src = run_dir / LEGACY_METRICS
    if not src.is_file() or src.is_symlink():
        return False
    data = read_bytes(src, DataError, "training log", limit=1 << 30)
    records = parse_jsonl_objects(data, str(src), cut_tail=True)
    new = staged(run_dir / METRICS)
    if not records:  # a run that has just started: nothing to convert yet
        return False
    try:
        write_records(new, records)
    except ValueError as e:
        new.unlink(missing_ok=True)
        raise DataError(f"{src}: {e}") from None
    if read_records(new) != records:
        new.unlink()
        raise DataError(f"{src}: its records do not come back from Parquet unchanged; left as it is")
    # metrics.jsonl is read first while it exists: the Parquet form replaces it when it goes
    commit(run_dir, [("put", METRICS), ("drop", LEGACY_METRICS, "sha256:" + hashlib.sha256(data).hexdigest())])
    return True


def check_log(run_dir: str | Path, resume: bool) -> None:
    """The training log a run is about to write, checked before anything is written: a folder,
    FIFO or broken link under its name is refused (opening a FIFO would block), and the log a
    resumed run goes on with must be whole: every line a record of `FIELDS`' types (only a
    last line without its newline, cut short by a kill, is left out), or the resume would
    drop a damaged line without a word and carry a non-finite number on into the run's log."""
    path = metrics_file(run_dir)
    if not resume or path is None:
        return
    if path.suffix != ".jsonl":
        read_metrics(run_dir)
        return
    data = read_bytes(path, DataError, "training log", limit=1 << 30)
    check_metrics(parse_jsonl_objects(data, str(path), cut_tail=True), path)


class MetricsLog:
    """metrics.jsonl: one JSON object per line, flushed as written."""

    def __init__(self, path: Path, resume_step: int | None = None, mirror=None):
        """A new log, or with `resume_step` the existing one continued after that step; `mirror`
        (a `rlmlab.learning.tensorboard.TensorBoardLog`) gets every record too."""
        self.path, self.mirror = path, mirror
        if resume_step is not None and not path.exists() and (path.parent / METRICS).exists():
            # a finished run, converted on export, trained on (`--extend`): its log goes on as lines
            path.write_text("".join(json.dumps(r) + "\n" for r in read_metrics(path.parent)))
            (path.parent / METRICS).unlink()
        if resume_step is not None and path.exists():
            # A run killed after its last save logged steps that the resumed run will redo.
            kept = [line for line in path.read_text(errors="replace").splitlines() if _step_of(line) <= resume_step]
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            tmp.replace(path)
        self.f = open(path, "a" if resume_step is not None else "w")

    def write(self, record: dict) -> None:
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()
        if self.mirror is not None:
            self.mirror.write(record)

    def close(self) -> None:
        self.f.close()
        if self.mirror is not None:
            self.mirror.close()


def _step_of(line: str) -> float:
    """The step of a metrics line; a line cut short by a kill (or not a record) counts as after every step."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return math.inf
    return step if isinstance(step, (int, float)) and not isinstance(step, bool) and step == step else math.inf

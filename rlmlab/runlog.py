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
from rlmlab.safeio import first_file, parse_json, parse_jsonl_objects, read_bytes

METRICS = "metrics.parquet"
LEGACY_METRICS = "metrics.jsonl"


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


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run's training log ([] when it has none)."""
    path = metrics_file(run_dir)
    if path is None:
        return []
    return read_jsonl_log(path) if path.suffix == ".jsonl" else read_records(path)


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

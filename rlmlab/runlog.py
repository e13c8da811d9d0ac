"""A run's training log: `metrics.jsonl` while the run trains (one JSON record per line,
appended and flushed as written), `metrics.parquet` once the run is finished and converted
(`rlmlab convert`, `rlmlab export`). Readers take either; no model code.
"""

from __future__ import annotations

from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.records import read_records, write_records
from rlmlab.safeio import parse_json

METRICS = "metrics.parquet"
LEGACY_METRICS = "metrics.jsonl"


def metrics_file(run_dir: str | Path) -> Path | None:
    """The run's training log (the live JSON lines first: a run that trains on after a
    conversion appends there), or None."""
    run_dir = Path(run_dir)
    for name in (LEGACY_METRICS, METRICS):
        if (run_dir / name).is_file():
            return run_dir / name
    return None


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
    """Replace a run's metrics.jsonl by metrics.parquet holding the same records (the lines
    that parse; a line cut short by a killed run never counted). Returns whether it converted."""
    run_dir = Path(run_dir)
    src = run_dir / LEGACY_METRICS
    if not src.is_file():
        return False
    records = read_jsonl_log(src)
    try:
        write_records(run_dir / METRICS, records)
    except ValueError as e:
        raise DataError(f"{src}: {e}") from None
    if read_records(run_dir / METRICS) != records:
        raise DataError(f"{src}: its records do not come back from Parquet unchanged; left as it is")
    src.unlink()
    return True

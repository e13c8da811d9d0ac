"""What the repository carries: every clone downloads every committed byte, forever. Records are
Parquet, optimizer state is never committed, and weights only when released or carried, small,
for an unfinished run (CONTRIBUTING.md)."""

from pathlib import Path

from rlmlab.measuring.result_files import LEGACY_RESULTS
from rlmlab.runlog import LEGACY_METRICS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
# A committed file may be this large; records of a run are far smaller as Parquet.
MAX_FILE_BYTES = 5 * 1024 * 1024
# The weights a user is meant to download: the checkpoints `rlmlab demo` evaluates.
RELEASED = ROOT / "rlmlab" / "released"
# The record files `rlmlab convert` turns into Parquet; a committed folder holds none of them.
JSON_LINES_RECORDS = {LEGACY_RESULTS, LEGACY_METRICS}
# All of results/ together (docs/results-format.md): records are Parquet, weights stay out.
# Sized for the experiments still running (CONTRIBUTING.md, "What the repository carries").
MAX_RESULTS_BYTES = 80 * 1000 * 1000
# The weights of unfinished runs carried between machines (`export --resumable`), all together.
MAX_CARRIED_BYTES = 10 * 1000 * 1000


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def test_no_large_file_in_results():
    large = [p.relative_to(ROOT) for p in _files(RESULTS) if p.stat().st_size > MAX_FILE_BYTES]
    assert not large, f"files over {MAX_FILE_BYTES >> 20} MB under results/ (convert or leave out): {large}"


def test_committed_records_are_parquet():
    jsonl = [p.relative_to(ROOT) for p in _files(RESULTS) if p.name in JSON_LINES_RECORDS]
    assert not jsonl, f"records under results/ are Parquet (`rlmlab convert`): {jsonl[:5]}"


def _carried(path: Path) -> bool:
    """Whether `path` lies in a checkpoint folder that `export --resumable` carried for a run
    still unfinished (its `last/`, or its `best/` when it awaits evaluation)."""
    return any((folder / "checkpoint.json").is_file() for folder in path.parents if RESULTS in folder.parents)


def test_results_fit_the_budget():
    sizes = {True: 0, False: 0}
    for p in _files(RESULTS):
        sizes[_carried(p)] += p.stat().st_size
    records, carried = sizes[False], sizes[True]
    assert records <= MAX_RESULTS_BYTES, f"results/ holds {records / 1e6:.1f} MB of records, over {MAX_RESULTS_BYTES / 1e6:.0f} MB"
    # Weights in transit: dropped by the export that finishes their run, but kept by git forever.
    assert carried <= MAX_CARRIED_BYTES, (f"results/ carries {carried / 1e6:.1f} MB of unfinished runs' weights, "
                                          f"over {MAX_CARRIED_BYTES / 1e6:.0f} MB")


def test_no_optimizer_state_committed():
    optimizer = [p.relative_to(ROOT) for p in _files(RESULTS) + _files(RELEASED) if p.name == "optimizer.safetensors"]
    assert not optimizer, f"optimizer state is never committed: {optimizer}"


def test_released_checkpoints_are_small():
    for p in _files(RELEASED):
        assert p.stat().st_size <= MAX_FILE_BYTES, f"{p.relative_to(ROOT)}: released weights stay small"

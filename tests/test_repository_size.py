"""What the repository carries: every clone downloads every committed byte, forever. Records are
Parquet, nothing resumable is committed, and only released checkpoints hold weights
(CONTRIBUTING.md)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
# A committed file may be this large; records of a run are far smaller as Parquet.
MAX_FILE_BYTES = 5 * 1024 * 1024
# The weights a user is meant to download: the checkpoints `rlmlab demo` evaluates.
RELEASED = ROOT / "rlmlab" / "released"
# Folders whose JSON lines are still to be converted (`rlmlab convert`): one session can submit
# at most 256 MiB of diff, so the 387 MB of JSON lines move to Parquet over several submissions.
PENDING_CONVERSION = {"iid-paper-cpu"}


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def test_no_large_file_in_results():
    large = [p.relative_to(ROOT) for p in _files(RESULTS) if p.stat().st_size > MAX_FILE_BYTES
             and p.relative_to(RESULTS).parts[0] not in PENDING_CONVERSION]
    assert not large, f"files over {MAX_FILE_BYTES >> 20} MB under results/ (convert or leave out): {large}"


def test_pending_conversions_are_still_pending():
    # The exemption list shrinks as folders are converted: a converted folder leaves it.
    for name in PENDING_CONVERSION:
        assert list((RESULTS / name).rglob("results.jsonl")), f"results/{name} is converted: drop it from the list"


def test_no_optimizer_state_committed():
    optimizer = [p.relative_to(ROOT) for p in _files(RESULTS) + _files(RELEASED) if p.name == "optimizer.safetensors"]
    assert not optimizer, f"optimizer state is never committed: {optimizer}"


def test_released_checkpoints_are_small():
    for p in _files(RELEASED):
        assert p.stat().st_size <= MAX_FILE_BYTES, f"{p.relative_to(ROOT)}: released weights stay small"

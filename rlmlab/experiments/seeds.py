"""Training seeds: an experiment's runs of one learner that differ only in the seed.

A seed index k trains with `train.seed` = 1337 + k, which sets the model's initialisation and
the order of the training data; the split, the validation set and the evaluation expressions
do not depend on it, so every seed of a cell is scored on the same expressions. Index 0 is the
run a single-seed folder always had.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlmlab.errors import ConfigError
from rlmlab.experiments.refs import has_job, read_refs

BASE_SEED = 1337
MAX_SEED_INDEX = 99


def seed_value(index: int) -> int:
    """The `train.seed` of seed index `index`."""
    return BASE_SEED + index


def check_seeds(seeds: list[int] | None) -> list[int]:
    """The seed indices asked for, sorted and checked (default: index 0 alone)."""
    if seeds is None:
        return [0]
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED_INDEX
                        for s in seeds):
        raise ConfigError(f"--seeds: expected seed indices 0..{MAX_SEED_INDEX}, got {seeds!r}")
    return sorted(set(seeds))


def seeded_job(job: str, seed: int) -> str:
    """Folder of seed index `seed` of the job whose seed-0 folder is `job`."""
    return job + (f"-s{seed}" if seed else "")


def split_seed(job: str) -> tuple[str, int]:
    """(the seed-0 job name, the seed index) of a job folder's name: `length-595-s2` ->
    (`length-595`, 2), `iid-N300-s1` -> (`iid-N300`, 1), `length-595` -> (`length-595`, 0)."""
    m = re.fullmatch(r"(.+)-s([0-9]{1,2})", job)
    return (m.group(1), int(m.group(2))) if m else (job, 0)


def seed_indices(out: Path, job: str) -> list[int]:
    """The seed indices of `job` that have a folder under `out` (seed 0: `job` itself, seed k:
    `job-s<k>`), in order; [0] when none has, so that a folder without runs reads as before."""
    pattern = re.compile(re.escape(job) + r"-s([1-9][0-9]?)")
    found = [0] if has_job(out, job) else []
    names = {d.name for d in out.iterdir() if d.is_dir()} if out.is_dir() else set()
    names |= {key.split("/")[0] for key in read_refs(out)} if out.is_dir() else set()
    found += sorted(int(m.group(1)) for name in names if (m := pattern.fullmatch(name)))
    return found or [0]

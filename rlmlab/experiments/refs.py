"""Runs an experiment folder holds by reference: one copy of each run.

A threshold sweep includes the runs of the single-threshold experiments at L = 595 and K = 10;
rather than a second copy of their files, its `refs.json` names each such run folder by path
(relative to the referring folder, inside the same results tree) and by a digest of its files:

    {"format": "rlmlab-refs/1",
     "runs": {"length-595/rm": {"path": "../length-595-paper-cpu-steps/length-595/rm",
                                "digest": "sha256:..."}}}

Every reader goes through `run_path` and `job_runs`, which follow a reference, and refuse one
that leaves the results tree, names a missing folder, or whose files no longer have its digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.journal import TRASH, commit, staged
from rlmlab.safeio import read_json

REFS = "refs.json"
FORMAT = "rlmlab-refs/1"
# Files a run folder's digest covers: all of them but a lock left by a live process.
SKIPPED = frozenset({".lock"})


def run_digest(run_dir: Path) -> str:
    """SHA-256 over every regular file of a run folder: its relative path and its bytes, in
    path order; a symbolic link is refused."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(run_dir):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name in SKIPPED:
                continue
            if path.is_symlink() or any(Path(dirpath, d).is_symlink() for d in dirnames):
                raise DataError(f"{run_dir}: holds a symbolic link ({path}); a referenced run is plain files")
            h.update(str(path.relative_to(run_dir)).encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return "sha256:" + h.hexdigest()


def read_refs(out: Path) -> dict[str, dict]:
    """{"<job>/<learner>": {"path", "digest"}} of a folder's refs.json ({} without one)."""
    path = out / REFS
    if not path.exists():
        return {}
    doc = read_json(path, DataError, REFS)
    runs = doc.get("runs") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    if not isinstance(runs, dict) or not all(
            isinstance(k, str) and k.count("/") == 1 and isinstance(v, dict) and isinstance(v.get("path"), str)
            and isinstance(v.get("digest"), str) for k, v in runs.items()):
        raise DataError(f"{path}: not a {FORMAT} file (a 'runs' object of job/learner: path and digest)")
    return runs


def _resolved(out: Path, key: str, entry: dict) -> Path:
    """The folder a reference names, checked: inside the results tree that holds `out`, a
    folder, and with the digest recorded."""
    root = out.resolve().parent
    target = (out / entry["path"]).resolve()
    if root not in target.parents:
        raise DataError(f"{out / REFS}: {key} points outside {root} ({entry['path']})")
    if not target.is_dir():
        raise DataError(f"{out / REFS}: {key} points at {entry['path']}, which is not a folder")
    if _digest(target, _stamp(target)) != entry["digest"]:
        raise DataError(f"{out / REFS}: {key}: the files of {entry['path']} have changed since the reference "
                        "was written (digest differs); export the run again")
    return target


def _stamp(target: Path) -> tuple:
    """Every file's path, size and modification time: a cheap key under which a digest, once
    computed, is reused while nothing changed."""
    return tuple((str(p), st.st_size, st.st_mtime_ns) for p in sorted(target.rglob("*"))
                 if (st := p.lstat()) and p.is_file())


@lru_cache(maxsize=256)
def _digest(target: Path, _stamp: tuple) -> str:
    return run_digest(target)


def run_path(out: Path, job: str, learner: str) -> Path:
    """The folder of run `<job>/<learner>` of experiment folder `out`: its own, else the one its
    refs.json names (checked), else the path it would have."""
    own = out / job / learner
    if own.is_dir():
        return own
    entry = read_refs(out).get(f"{job}/{learner}")
    return own if entry is None else _resolved(out, f"{job}/{learner}", entry)


def job_runs(out: Path, job: str) -> dict[str, Path]:
    """{learner: run folder} of a job: the folders under `out/job/` and the runs refs.json
    names for it."""
    found = {d.name: d for d in (out / job).iterdir() if d.is_dir()} if (out / job).is_dir() else {}
    for key, entry in read_refs(out).items():
        ref_job, learner = key.split("/")
        if ref_job == job and learner not in found:
            found[learner] = _resolved(out, key, entry)
    return found


# Folders of an experiment folder that hold no runs (TRASH: runs on their way out, once held by reference).
NOT_JOBS = frozenset({"data", "report", "view", TRASH})


def experiment_runs(out: Path) -> list[tuple[str, str, Path]]:
    """(job, learner, run folder) of every run an experiment folder holds or refers to, by job
    and learner."""
    found = {(d.parent.name, d.name): d for d in out.glob("*/*") if d.is_dir() and d.parent.name not in NOT_JOBS}
    for key, entry in read_refs(out).items():
        job, learner = key.split("/")
        if (job, learner) not in found:
            found[(job, learner)] = _resolved(out, key, entry)
    return [(job, learner, found[(job, learner)]) for job, learner in sorted(found)]


def has_job(out: Path, job: str) -> bool:
    return (out / job).is_dir() or any(key.split("/")[0] == job for key in read_refs(out))


def _refs_text(runs: dict[str, dict]) -> str:
    return json.dumps({"format": FORMAT, "runs": dict(sorted(runs.items()))}, indent=2) + "\n"


def _working(folder: Path) -> bool:
    """Whether `folder` is one `rlmlab run` works in (it holds the run lock; exports leave it
    out): its runs may still be resumed or extended there, so it neither refers to another
    folder's runs nor is referred to."""
    return (folder / ".lock").exists()


def _plain_dir(path: Path) -> bool:
    """A folder reached through no symbolic link (`path` lies under a resolved folder)."""
    return path.is_dir() and not path.is_symlink() and os.path.realpath(path) == str(path)


def _digest_or_none(run: Path) -> str | None:
    """A run folder's digest, or None for one that holds a symbolic link (never referred to)."""
    try:
        return run_digest(run)
    except DataError:
        return None


def refer_to_siblings(out: Path, runs: set[str] | None = None) -> list[str]:
    """Replace each run folder of `out` (of `runs`, "<job>/<learner>" names, when given) that
    another experiment folder beside it (in the same results tree) holds byte for byte, at the
    same `<job>/<learner>`, by a reference to that copy; folders `rlmlab run` works in are left
    out on both sides (`_working`). Returns the runs now held by reference.

    One transaction (`rlmlab.journal`): refs.json is written beside the old one, then it and the
    moves of the runs it now names are journalled. No symbolic link is followed on either side:
    a run reached through one is neither referred to nor removed, and no folder outside `out`
    is ever removed."""
    base = out.resolve()
    if _working(out):
        return []
    siblings = [s for s in sorted(base.parent.iterdir())
                if s != base and _plain_dir(s) and (s / "experiment.json").is_file() and not _working(s)]
    found = {}
    for job in sorted(d for d in base.iterdir() if _plain_dir(d) and d.name not in NOT_JOBS):
        for run in sorted(d for d in job.iterdir() if _plain_dir(d)):
            key = f"{job.name}/{run.name}"
            twins = [s / key for s in siblings if _plain_dir(s / job.name) and _plain_dir(s / key)]
            if (runs is not None and key not in runs) or not twins:
                continue
            mine = _digest_or_none(run)
            twin = next((t for t in twins if mine is not None and _digest_or_none(t) == mine), None)
            if twin is not None:
                found[key] = {"path": os.path.relpath(twin, base), "digest": mine}
    if not found:
        return []
    staged(base / REFS).write_text(_refs_text({**read_refs(base), **found}))
    commit(base, [("put", REFS)] + [("trash", key, entry["path"]) for key, entry in sorted(found.items())])
    return sorted(found)

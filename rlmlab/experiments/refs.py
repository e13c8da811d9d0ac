"""Runs an experiment folder holds by reference: one copy of each run.

A threshold sweep includes the runs of the single-threshold experiments at L = 595 and K = 10;
rather than a second copy of their files, its `refs.json` names each such run folder by path
(relative to the referring folder, inside the same results tree) and by a digest of its files:

    {"format": "rlmlab-refs/1",
     "runs": {"length-595/rm": {"path": "../length-595-paper-cpu-steps/length-595/rm",
                                "digest": "sha256:..."}}}

Every reader goes through `run_path` and `job_runs`, which follow a reference, and refuse one
that leaves the results tree, names a missing folder, or whose files no longer have its digest.
`read_refs` checks every key and path as text first (`check_ref`), before any of them reaches
the file system: a key is `<job>/<learner>`, a path `../<experiment>/<job>/<learner>`, each
part a plain folder name.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.journal import TRASH, commit, staged
from rlmlab.safeio import read_json, shorten

REFS = "refs.json"
FORMAT = "rlmlab-refs/1"
# Files a run folder's digest covers: all of them but a lock left by a live process.
SKIPPED = frozenset({".lock"})
# A folder name is at most 255 bytes on every file system rlmlab runs on; a key or a path is
# measured as text before any part of it is handed to the file system.
NAME_MAX_BYTES = 255
KEY_MAX_CHARS = 2 * NAME_MAX_BYTES + 1
PATH_MAX_CHARS = 3 * NAME_MAX_BYTES + 6
DIGEST_CHARS = len("sha256:") + 64


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
            isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("path"), str)
            and isinstance(v.get("digest"), str) for k, v in runs.items()):
        raise DataError(f"{path}: not a {FORMAT} file (a 'runs' object of job/learner: path and digest)")
    for key, entry in runs.items():
        check_ref(path, key, entry)
    return runs


def check_ref(where: Path, key: str, entry: dict) -> None:
    """Refuse, as text and before any file system call, a reference whose key is not
    `<job>/<learner>` or whose path is not `../<experiment>/<job>/<learner>` (each part a plain
    folder name), or whose digest is not a SHA-256: anything else could name a folder outside
    the results tree, or a place outside a `--out` folder that a reader writes under the key."""
    if len(key) > KEY_MAX_CHARS or not _plain_names(key.split("/"), 2) or key.split("/")[0] in NOT_JOBS:
        raise DataError(f"{where}: {shorten(repr(key))} is not a run (<job>/<learner>, each a plain folder name)")
    target = entry["path"]
    parts = target.split("/")
    if len(target) > PATH_MAX_CHARS or parts[0] != ".." or not _plain_names(parts[1:], 3):
        raise DataError(f"{where}: {key}: the path {shorten(repr(target))} is not a run folder beside this one "
                        "(../<experiment>/<job>/<learner>, each a plain folder name)")
    digest = entry["digest"]
    if not (len(digest) == DIGEST_CHARS and digest.startswith("sha256:")
            and all(c in "0123456789abcdef" for c in digest[7:])):
        raise DataError(f"{where}: {key}: the digest {shorten(repr(digest))} is not sha256:<64 hex digits>")


def _plain_names(parts: list[str], n: int) -> bool:
    """Whether `parts` are `n` plain folder names: not empty, `.` or `..`, no separator, and
    printable (no NUL, control character or lone surrogate), of at most NAME_MAX_BYTES bytes."""
    return len(parts) == n and all(
        p not in ("", ".", "..") and "\\" not in p and p.isprintable()
        and len(p.encode("utf-8")) <= NAME_MAX_BYTES for p in parts)


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


def refer_to_siblings(out: Path, runs: set[str] | None = None, standing_for: Path | None = None) -> list[str]:
    """Replace each run folder of `out` (of `runs`, "<job>/<learner>" names, when given) that
    another experiment folder beside it (in the same results tree) holds byte for byte, at the
    same `<job>/<learner>`, by a reference to that copy; folders `rlmlab run` works in are left
    out on both sides (`_working`), and so are hidden folders (an export being built) and
    `standing_for`, the folder `out` is built to replace. Returns the runs now held by reference.

    One transaction (`rlmlab.journal`): refs.json is written beside the old one, then it and the
    moves of the runs it now names are journalled. No symbolic link is followed on either side:
    a run reached through one is neither referred to nor removed, and no folder outside `out`
    is ever removed."""
    base = out.resolve()
    if _working(out):
        return []
    skipped = {base} | ({standing_for.resolve()} if standing_for is not None else set())
    siblings = [s for s in sorted(base.parent.iterdir())
                if s not in skipped and not s.name.startswith(".") and _plain_dir(s)
                and (s / "experiment.json").is_file() and not _working(s)]
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

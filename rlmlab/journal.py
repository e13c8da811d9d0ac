"""Replacing a folder's files so that a kill at any instant loses nothing.

A change (JSON lines converted to Parquet, a run folder replaced by a reference) is written
beside the files it replaces, under names no reader opens (`staged`), checked, and fsynced;
then a journal (`.convert-journal.json`) lists its steps, and only then do the steps run:

    {"format": "rlmlab-convert-journal/1",
     "steps": [["put", "results.parquet.convert-new", "results.parquet", "sha256:..."],
               ["drop", "results.jsonl", "sha256:..."],
               ["trash", "job/learner", "../other-experiment/job/learner"]]}

- put: rename a staged file (of that digest) over its final name;
- drop: delete a file, only while it still has the digest of the bytes that were converted;
- trash: move a run folder out of readers' sight (`TRASH`), only while it is still, file for
  file, byte for byte, the folder it is a copy of; the trash is emptied at the end.

Each step is idempotent and leaves the folder readable as either the old files or the new ones,
so `recover` finishes a journal a killed process left (rolls forward); without a journal, it
removes the staged files of a change that never started (rolls back). Nothing outside the
journal's folder is ever deleted, and no symbolic link is followed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from rlmlab.errors import DataError
from rlmlab.safeio import read_json

JOURNAL = ".convert-journal.json"
FORMAT = "rlmlab-convert-journal/1"
STAGED = ".convert-new"  # suffix of a new file written beside the one it will replace
TRASH = ".convert-trash"  # a run folder moved here is out of every reader's sight until removed
# write_records writes `<name>.tmp` and renames it: a staged file's own temporary file.
LEFTOVERS = (STAGED, STAGED + ".tmp")


def staged(path: str | Path) -> Path:
    """Where the new file that will replace `path` is written first."""
    path = Path(path)
    return path.with_name(path.name + STAGED)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def commit(folder: Path, steps: list[tuple]) -> None:
    """Run `steps` in `folder` as one change that a killed process leaves finished or undone:
    ("put", name[, source]) moves `staged(name)` (or `source`) over `name`; ("drop", name[, digest]) deletes `name`
    (only with `digest`, the bytes read, when given); ("trash", "job/learner", path to its twin
    relative to `folder`) removes a run folder identical to its twin. The staged files must be
    complete and checked."""
    folder = Path(folder)
    entries = []
    for step in steps:
        if step[0] == "put":
            src = step[2] if len(step) > 2 else staged(folder / step[1]).name
            _fsync(folder / src)
            entries.append(["put", src, step[1], file_digest(folder / src)])
        elif step[0] == "drop":
            digest = step[2] if len(step) > 2 else file_digest(folder / step[1])
            entries.append(["drop", step[1], digest])
        else:
            entries.append(list(step))
    doc = {"format": FORMAT, "steps": entries}
    tmp = folder / (JOURNAL + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    _fsync(tmp)
    os.replace(tmp, folder / JOURNAL)
    _fsync(folder)
    _roll_forward(folder, doc)


def recover(folder: Path) -> bool:
    """Finish the change a journal in `folder` lists, else remove the staged files of one that
    never started; whether there was anything to do."""
    folder = Path(folder)
    if (folder / JOURNAL).is_file() and not (folder / JOURNAL).is_symlink():
        _roll_forward(folder, _read_journal(folder))
        return True
    left = [p for p in folder.iterdir() if p.name == JOURNAL + ".tmp" or p.name.endswith(LEFTOVERS)]
    for p in left:
        if p.is_file() or p.is_symlink():
            p.unlink()
    return bool(left)


def _read_journal(folder: Path) -> dict:
    """The journal of `folder`, checked: plain names, runs two levels down, twins beside."""
    path = folder / JOURNAL
    doc = read_json(path, DataError, "journal")
    steps = doc.get("steps") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    ok = isinstance(steps, list)
    for step in steps if ok else []:
        kind = step[0] if isinstance(step, list) and step else None
        if kind == "put":
            ok &= len(step) == 4 and all(_name(x) for x in step[1:3]) and isinstance(step[3], str)
        elif kind == "drop":
            ok &= len(step) == 3 and _name(step[1]) and isinstance(step[2], str)
        elif kind == "trash":
            ok &= (len(step) == 3 and isinstance(step[1], str) and isinstance(step[2], str)
                   and step[1].count("/") == 1 and all(_name(x) for x in step[1].split("/")))
        else:
            ok = False
    if not ok:
        raise DataError(f"{path}: not a {FORMAT} file; finish or undo its conversion by hand, then remove it")
    return doc


def _name(x) -> bool:
    """A file name of the folder itself: no path, not hidden."""
    return isinstance(x, str) and x == os.path.basename(x) and x not in ("", ".", "..") and not x.startswith(".")


def _roll_forward(folder: Path, doc: dict) -> None:
    journal = folder / JOURNAL
    for step in doc["steps"]:
        if step[0] == "put":
            _put(folder, *step[1:])
        elif step[0] == "drop":
            _drop(folder, *step[1:])
        else:
            _trash(folder, *step[1:])
        _fsync(folder)
    trash = folder / TRASH
    if trash.is_symlink():
        trash.unlink()
    elif trash.exists():
        shutil.rmtree(trash)
    journal.unlink()
    _fsync(folder)


def _put(folder: Path, src: str, dst: str, digest: str) -> None:
    if (folder / src).is_file() and not (folder / src).is_symlink():
        if file_digest(folder / src) != digest:
            raise DataError(f"{folder / src}: not the file its conversion wrote (digest differs); "
                            f"left as it is with {folder / JOURNAL}")
        os.replace(folder / src, folder / dst)
    elif not ((folder / dst).is_file() and file_digest(folder / dst) == digest):
        raise DataError(f"{folder / JOURNAL}: {dst} is neither staged nor in place; finish its conversion "
                        "by hand, then remove the journal")


def _drop(folder: Path, name: str, digest: str) -> None:
    path = folder / name
    if path.is_symlink():
        path.unlink()  # the link, never what it points at
    elif path.is_file():
        if file_digest(path) != digest:
            raise DataError(f"{path}: changed while it was being converted; left as it is, with its new "
                            f"form beside it (remove {folder / JOURNAL} and convert again)")
        path.unlink()


def _trash(folder: Path, run: str, twin: str) -> None:
    """Move run folder `run` of `folder` into the trash, if it is still a plain folder inside
    `folder` and file for file the folder `twin` (a plain folder beside `folder`); its job's
    folder goes too once empty."""
    base = folder.resolve()
    path, other = base / run, Path(os.path.normpath(base / twin))
    beside = len(other.parents) > 2 and other.parents[2] == base.parent and other.parents[1] != base  # <sibling>/<job>/<learner>
    if beside and _plain_dir(path, base) and _plain_dir(other, base.parent) and same_tree(path, other):
        (base / TRASH / run).parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, base / TRASH / run)
    job = path.parent
    if _plain_dir(job, base) and not any(job.iterdir()):
        job.rmdir()


def _plain_dir(path: Path, inside: Path) -> bool:
    """Whether `path` is a folder strictly inside `inside` (resolved) reached through no
    symbolic link."""
    return (inside in path.parents and os.path.realpath(path) == str(path)
            and path.is_dir() and not path.is_symlink())


def same_tree(a: Path, b: Path) -> bool:
    """Whether folders `a` and `b` hold the same files, byte for byte, and no symbolic link."""
    def listing(root: Path):
        found = {}
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = Path(dirpath, name)
                if p.is_symlink():
                    return None
                found[str(p.relative_to(root))] = p if name in filenames else None
        return found

    la, lb = listing(a), listing(b)
    if la is None or lb is None or la.keys() != lb.keys():
        return False
    for rel, p in la.items():
        q = lb[rel]
        if (p is None) != (q is None):
            return False
        if p is not None and (p.stat().st_size != q.stat().st_size or p.read_bytes() != q.read_bytes()):
            return False
    return True


def _fsync(path: Path) -> None:
    """Push a file's bytes (or a folder's entries) to disk: a power cut after the rename that
    follows must not find an empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

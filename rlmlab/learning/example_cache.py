"""Training examples on disk: the .npz file of an `ExampleSet` (never pickle), every array
checked when it is read, and the cache that keeps one file per expression list, learner,
vocabulary, task and position index (`data.cache_dir`), so that a run resumed or started again
on the same data does not execute its expressions again.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tokenize
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rlmlab.errors import DataError, RlmlabError
from rlmlab.safeio import parse_json
from rlmlab.task.taskfile import Task
from rlmlab.task.vocab import Vocab

EXAMPLES_FORMAT = "rlmlab-examples/1"
# name: dtype of every array a file holds (layout only for packings with one: (N_tokens, 3))
DTYPES = {"ids": np.uint16, "loss": np.bool_, "offsets": np.int64, "source": np.int64, "layout": np.int32}


def arrays_digest(*arrays: np.ndarray | None) -> str:
    """SHA-256 over the arrays' types, shapes and bytes (an absent layout counts for nothing)."""
    h = hashlib.sha256()
    for a in arrays:
        if a is not None:
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def write_examples(path: str | Path, learner: str, vocab: Vocab, n_expressions: int, digest: str,
                   arrays: dict[str, np.ndarray]) -> None:
    """Write an `ExampleSet`'s arrays to .npz atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"format": EXAMPLES_FORMAT, "learner": learner, "vocab": list(vocab.tokens),
                       "n_expressions": n_expressions, "sha256": digest})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays, meta=np.array(meta))
        os.replace(tmp, path)
    except BaseException:  # a full disk, a folder in the way, Ctrl-C: no tens of megabytes left behind
        tmp.unlink(missing_ok=True)
        raise


def read_examples(path: str | Path) -> tuple[dict, str | None]:
    """The `ExampleSet` fields of a file `write_examples` wrote, every array checked for its
    shape, type and range, and the SHA-256 its metadata claims (the caller compares it with the
    arrays' own). Anything else is a one-line DataError."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = parse_json(str(z["meta"]), f"{path}: metadata")
            arrays = {k: z[k] for k in ("ids", "loss", "offsets", "source")}
            layout = z["layout"] if "layout" in z.files else None
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    # What np.load raises on a damaged zip: cut short (EOFError), a bad header (struct.error),
    # a compression method byte it does not know (NotImplementedError), an array header its
    # parser cannot read (SyntaxError, tokenize.TokenError, RecursionError).
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, NotImplementedError, struct.error,
            SyntaxError, tokenize.TokenError, RecursionError) as e:
        raise DataError(f"{path}: not a training-examples file ({type(e).__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != EXAMPLES_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise DataError(f"{path}: format {found!r}, expected {EXAMPLES_FORMAT!r}")
    ids, loss, offsets, source = (arrays[k] for k in ("ids", "loss", "offsets", "source"))
    # Shapes and types first: every check below indexes or compares these arrays.
    if any(a.ndim != 1 for a in arrays.values()) or len(offsets) == 0 or (layout is not None and layout.ndim != 2) \
            or any(a.dtype != DTYPES[k] for k, a in {**arrays, "layout": layout}.items() if a is not None):
        raise DataError(f"{path}: arrays of the wrong shape or type")
    if offsets[-1] != len(ids) or len(loss) != len(ids) or len(source) != len(offsets) - 1 \
            or (layout is not None and layout.shape != (len(ids), 3)):
        raise DataError(f"{path}: inconsistent array lengths")
    try:
        vocab = Vocab(meta["vocab"])
    except (RlmlabError, KeyError, TypeError):
        raise DataError(f"{path}: no valid vocabulary") from None
    if (len(ids) and int(ids.max()) >= len(vocab)) or np.any(np.diff(offsets) < 0) or offsets[0] != 0:
        raise DataError(f"{path}: token ids outside the vocabulary or offsets out of order")
    try:
        learner, n_expressions = str(meta["learner"]), int(meta["n_expressions"])
    except (KeyError, TypeError, ValueError, OverflowError):
        raise DataError(f"{path}: no learner name or expression count") from None
    if len(source) and not 0 <= int(source.min()) <= int(source.max()) < n_expressions:
        raise DataError(f"{path}: examples of expressions it does not hold")
    fields = {"learner": learner, "vocab": vocab, **arrays, "n_expressions": n_expressions, "layout": layout}
    return fields, meta.get("sha256")


def cache_key(exprs: Sequence[str], learner: str, vocab: Vocab, task: Task,
              position_index: str | None = None) -> str:
    """The name of the cache entry of these expressions' examples."""
    key = {"format": EXAMPLES_FORMAT, "learner": learner, "vocab": list(vocab.tokens)}
    if not task.is_paper:  # the paper's keys stay those written before tasks existed
        key["task"] = task.digest
    if position_index is not None:  # likewise the keys of every learner at its own index
        key["position_index"] = position_index
    h = hashlib.sha256(json.dumps(key).encode())
    for text in exprs:
        h.update(text.encode())
        h.update(b"\n")
    return h.hexdigest()[:24]


def entry_path(cache_dir: str | Path, exprs: Sequence[str], learner: str, vocab: Vocab, task: Task,
               position_index: str | None = None) -> Path:
    """Where the cache keeps these expressions' examples, checked before they are built (the
    save would fail after): its folder is a file, or its own name is taken by a folder (or a
    device, a FIFO), which no rename replaces."""
    path = Path(cache_dir) / f"{learner}-{cache_key(exprs, learner, vocab, task, position_index)}.npz"
    if path.parent.exists() and not path.parent.is_dir():
        raise DataError(f"data.cache_dir: {path.parent} is not a folder")
    if path.exists() and not path.is_symlink() and not path.is_file():
        raise DataError(f"data.cache_dir: {path} is {'a folder' if path.is_dir() else 'not a regular file'}, "
                        "where the cache of these examples goes; remove it or choose another data.cache_dir")
    return path

"""Reading what a user hands us without trusting it: regular files only (a FIFO or /dev/zero
would block or never end), a size bound checked before reading, and JSON with a bounded
nesting depth, decoded as UTF-8. Every failure is an `RlmlabError` of the caller's class,
on one line. Also the one place that cuts user text echoed into an error message."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from rlmlab.errors import ECHO_CHARS, DataError, RlmlabError

MAX_TEXT_BYTES = 64 << 20  # a config, a summary or a checkpoint's JSON: far below this
MAX_DEPTH = 32  # nesting of any JSON file the project writes is at most 4


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` cut to about `limit` characters, for echoing user input in an error."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def regular_file(path: str | Path, error: type[RlmlabError] = DataError, what: str = "file") -> Path:
    """`path`, checked to be a regular file (following symlinks) without opening it."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{path}: no such file (cannot read {what})") from None
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path}: is a folder, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: not a regular file (a device, FIFO or socket cannot be a {what})")
    return path


def read_bytes(path: str | Path, error: type[RlmlabError] = DataError, what: str = "file",
               limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes."""
    path = regular_file(path, error, what)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror})") from None
    if len(data) > limit:
        raise error(f"{path}: {what} larger than {limit:,} bytes")
    return data


def read_text(path: str | Path, error: type[RlmlabError] = DataError, what: str = "file",
              limit: int = MAX_TEXT_BYTES) -> str:
    """A regular file of at most `limit` bytes as UTF-8 text."""
    try:
        return read_bytes(path, error, what, limit).decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: {what} is not UTF-8 text (byte {e.start})") from None


def depth(value) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d + 1)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(text: str | bytes, where: str, error: type[RlmlabError] = DataError, max_depth: int = MAX_DEPTH):
    """`text` as JSON nested at most `max_depth` deep; `where` names it in errors."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply (more than {max_depth} levels)") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise error(f"{where}: not valid JSON ({shorten(str(e).splitlines()[0])})") from None
    # Each level opens a bracket, so a text with few brackets (brackets inside strings counted
    # too) cannot be nested too deeply; only the others are walked.
    brackets = (text.count("[") + text.count("{")) if isinstance(text, str) else (text.count(b"[") + text.count(b"{"))
    if brackets > max_depth and depth(value) > max_depth:
        raise error(f"{where}: JSON nested too deeply (more than {max_depth} levels)")
    return value


def read_json(path: str | Path, error: type[RlmlabError] = DataError, what: str = "JSON file",
              limit: int = MAX_TEXT_BYTES, max_depth: int = MAX_DEPTH):
    """A regular file of at most `limit` bytes parsed as bounded JSON."""
    return parse_json(read_text(path, error, what, limit), str(path), error, max_depth)


def read_jsonl(path: str | Path, error: type[RlmlabError] = DataError, what: str = "JSON-lines file",
               limit: int = 1 << 30, max_depth: int = MAX_DEPTH) -> list:
    """One bounded JSON value per non-blank line."""
    text = read_text(path, error, what, limit)
    return [parse_json(line, f"{path}: line {n}", error, max_depth)
            for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def parse_jsonl_objects(data: bytes, where: str, error: type[RlmlabError] = DataError,
                        cut_tail: bool = False, max_depth: int = MAX_DEPTH) -> list[dict]:
    """Every non-blank line of `data` as a JSON object, or one-line `error` naming the first
    line that is not (not UTF-8, not JSON, not an object): a record file converted for good
    must lose no line. With `cut_tail`, a last line without its newline that does not parse
    (written by a process killed mid-line, which no reader counts) is left out."""
    lines = data.split(b"\n")
    records = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if cut_tail and n == len(lines):
                break
            raise error(f"{where}: line {n}: not UTF-8 text (byte {e.start} of the line)") from None
        try:
            value = parse_json(text, f"{where}: line {n}", error, max_depth)
        except RlmlabError:
            if cut_tail and n == len(lines):
                break
            raise
        if not isinstance(value, dict):
            raise error(f"{where}: line {n}: not a JSON object (a {type(value).__name__}); each line is one record")
        records.append(value)
    return records


def json_safe(value):
    """A scalar from a data column as JSON writes it: non-finite floats become null (JSON has
    no NaN), bytes are refused by the caller before this."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def memory_bytes() -> int:
    """This machine's physical memory: what any single allocation must stay below."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a large workstation
        return 1 << 40


def check_fits(n_bytes: int, what: str, error: type[RlmlabError] = DataError) -> None:
    """Refuse, before allocating, a size that cannot fit in this machine's memory (an allocator
    error, a MemoryError or a swap storm otherwise, long after the input was read)."""
    have = memory_bytes()
    if n_bytes > have:
        raise error(f"{what} needs {_size(n_bytes)}, more than this machine's {_size(have)} of memory")


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"


def first_file(folder: str | Path, names, error: type[RlmlabError] = DataError) -> Path | None:
    """The first of `names` present in `folder`, or None. A folder, FIFO or broken link under
    such a name is refused rather than passed over as absent: a report would otherwise drop
    that run's row without a word."""
    for name in names:
        if os.path.lexists(path := Path(folder) / name):
            return regular_file(path, error, name)
    return None


# --- what a folder holds, checked before writing into it ---------------------

def folder_kind(path: str | Path) -> str | None:
    """What an existing folder holds, by the files the commands write: "experiment"
    (`rlmlab run`, or an export of one), "training run" (`rlmlab train`), "evaluation"
    (`rlmlab eval`), or None (absent, empty, or anything else)."""
    path = Path(path)
    if not path.is_dir():
        return None
    if (path / "experiment.json").exists():
        return "experiment"
    if any((path / name / "checkpoint.json").exists() for name in ("last", "best", ".last.old", ".best.old")) \
            or ((path / "config.json").exists() and any((path / n).exists() for n in ("metrics.jsonl", "metrics.parquet"))):
        return "training run"
    if (path / "summary.json").exists() and any((path / n).exists() for n in ("results.parquet", "results.jsonl")):
        return "evaluation"
    return None


def refuse_other_folder(path: str | Path, wanted: str, option: str, error: type[RlmlabError] = DataError) -> None:
    """Refuse to write a `wanted` ("experiment", "training run", "evaluation") into a folder
    that holds something else: its files would be overwritten, or hidden among ours."""
    held = folder_kind(path)
    if held is not None and held != wanted:
        raise error(f"{option} {path}: holds {_article(held)}, not {_article(wanted)}; choose another folder")


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def refuse_outside(path: str | Path, root: str | Path, error: type[RlmlabError] = DataError) -> None:
    """Refuse to copy `path` when it, or a folder on its way, is a symbolic link that leads out
    of `root`, the tree being copied: the copy would carry a file from elsewhere on the machine."""
    path, root = Path(path), Path(root)
    if not path.resolve().is_relative_to(root.resolve()):
        raise error(f"{path}: a symbolic link to {shorten(str(path.resolve()))}, outside {root}; "
                    "only files inside it are copied")


def refuse_symlinks(root: str | Path, option: str, error: type[RlmlabError] = DataError) -> None:
    """Refuse a destination folder that is a file, a symbolic link, or a tree holding one:
    writing through a link would change files outside the folder, and a file in its place would
    be moved aside. An absent destination passes."""
    root = Path(root)
    if root.is_symlink():
        raise error(f"{option} {root}: a symbolic link (to {shorten(os.readlink(root))}); "
                    "rlmlab writes only into plain folders")
    if root.exists() and not root.is_dir():
        raise error(f"{option} {root}: a file, not a folder")
    if not root.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if os.path.islink(os.path.join(dirpath, name)):
                raise error(f"{option} {root}: holds a symbolic link ({os.path.join(dirpath, name)}); "
                            "writing through it would change a file outside the folder")

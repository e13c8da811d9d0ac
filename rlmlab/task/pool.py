"""Expression pools: one parquet row per sampled expression, with its value and trace statistics.

Expressions are drawn in fixed-size chunks, each from its own RNG seeded by (seed, chunk
index), so the file depends on the seed alone, never on the number of workers.
The vocabulary, the generator settings and the task's identity are stored in the file's
metadata; reading a pool for another task is refused.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rlmlab.errors import ConfigError, DataError, VocabError
from rlmlab.safeio import read_json, regular_file
from rlmlab.task.expr import infer_type, to_text, value_token
from rlmlab.task.sampler import GeneratorConfig
from rlmlab.task.taskfile import Task, check_same_task
from rlmlab.task.trace import trace_stats
from rlmlab.task.vocab import Vocab

TASK_KEY = b"rlmlab.task"

CHUNK = 4096
COLUMNS = ("id", "expr", "root", "type", "value", "trace_len", "max_depth", "max_frame_width", "n_frame_examples")
SCHEMA = pa.schema([
    ("id", pa.int64()), ("expr", pa.string()), ("root", pa.string()), ("type", pa.string()),
    ("value", pa.string()), ("trace_len", pa.int32()), ("max_depth", pa.int16()),
    ("max_frame_width", pa.int32()), ("n_frame_examples", pa.int32()),
])


def chunk_rng(seed: int, chunk: int) -> random.Random:
    return random.Random(f"rlmlab-pool:{seed}:{chunk}")


def _build_chunk(args: tuple[int, int, int, GeneratorConfig, Task]) -> dict[str, list]:
    seed, chunk, n, config, task = args
    library = task.library
    sampler = task.sampler(config)
    rng = chunk_rng(seed, chunk)
    cols: dict[str, list] = {c: [] for c in COLUMNS}
    for i in range(n):
        e = sampler.sample(rng)
        s = trace_stats(e, library)
        cols["id"].append(chunk * CHUNK + i)
        cols["expr"].append(to_text(e))
        cols["root"].append(e.fn)
        cols["type"].append(infer_type(e, library))
        cols["value"].append(value_token(s.value))
        cols["trace_len"].append(s.trace_len)
        cols["max_depth"].append(s.max_depth)
        cols["max_frame_width"].append(s.max_frame_width)
        cols["n_frame_examples"].append(s.n_frame_examples)
    return cols


def build_pool(n: int, seed: int, workers: int | None = None, config: GeneratorConfig | None = None,
               progress: bool = False, *, task: Task) -> pa.Table:
    """Sample `n` expressions of `task` with `seed` and return the pool as an Arrow table.
    `config` overrides the task's generator settings."""
    config = config or task.generator
    if n < 1:
        raise DataError(f"pool size must be positive, got {n}")
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    workers = workers or os.cpu_count() or 1
    jobs = [(seed, c, min(CHUNK, n - c * CHUNK), config, task) for c in range((n + CHUNK - 1) // CHUNK)]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="expr", desc="pool", dynamic_ncols=True)
    parts = []
    if workers == 1 or len(jobs) == 1:
        results = map(_build_chunk, jobs)
        for cols in results:
            parts.append(pa.table(cols, schema=SCHEMA))
            bar and bar.update(len(cols["id"]))
    else:
        with ProcessPoolExecutor(workers) as ex:
            for cols in ex.map(_build_chunk, jobs, chunksize=1):
                parts.append(pa.table(cols, schema=SCHEMA))
                bar and bar.update(len(cols["id"]))
    bar and bar.close()
    table = pa.concat_tables(parts)
    meta = {"rlmlab.task.vocab": task.vocab.to_json(),
            "rlmlab.task.pool": json.dumps({"n": n, "seed": seed, "generator": asdict(config)}),
            TASK_KEY.decode(): json.dumps(task.identity)}
    return table.replace_schema_metadata(meta)


def write_pool(table: pa.Table, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _saved_vocab(path: Path, raw: bytes) -> Vocab:
    """The vocabulary a parquet file's metadata records (bounded JSON, UTF-8)."""
    try:
        return Vocab.from_json(raw)
    except VocabError as e:
        raise DataError(f"{path}: vocabulary metadata: {e}") from None


def read_pool(path: str | Path, check: int = 64, *, task: Task) -> pa.Table:
    """Read a pool (or any expression set with an `expr` column) of `task` and validate it.

    A file that records another task, or another vocabulary, is refused; one that records no
    task (written before tasks were recorded, or by hand) counts as the paper's when it records
    a vocabulary. The first `check` rows are re-parsed with the task's library so that a file
    from elsewhere fails early with a one-line error rather than deep inside training.
    """
    path = regular_file(path, DataError, "data file")
    try:
        table = pq.read_table(path)
        table.validate(full=True)  # a damaged page that still decodes (text that is not UTF-8)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise DataError(f"{path}: not a readable parquet file ({type(e).__name__})") from None
    if "expr" not in table.column_names:
        raise DataError(f"{path}: no 'expr' column (has {', '.join(table.column_names)})")
    column = table.column("expr")
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise DataError(f"{path}: the 'expr' column holds {column.type}, not strings")
    if column.null_count:
        first = pc.index(pc.is_null(column), True).as_py()
        raise DataError(f"{path}: row {first}: empty (null) expression")
    meta = table.schema.metadata or {}
    if TASK_KEY in meta:
        check_same_task(_json(meta[TASK_KEY], path), task, f"{path}")
    if b"rlmlab.task.vocab" in meta and _saved_vocab(path, meta[b"rlmlab.task.vocab"]) != task.vocab:
        raise DataError(f"{path}: written with a different vocabulary than {task.describe()}'s")
    for i, text in enumerate(table.column("expr").slice(0, check).to_pylist()):
        try:
            task.parse(text)
        except Exception as e:  # noqa: BLE001
            raise DataError(f"{path}: row {i}: {e}") from None
    return table


def _json(raw: bytes, path: Path):
    try:
        return json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise DataError(f"{path}: its task record is not valid JSON") from None


# --- saved data sets: expression tables and the JSON file that lists them ---

def write_table_folder(folder: str | Path, meta_file: str, fmt: str, meta: dict,
                       tables: Mapping[str, pa.Table]) -> Path:
    """Save named tables as parquet files plus a JSON file that lists them with row counts.

    Each file is written to a temporary name and renamed; the JSON goes last, so a folder
    whose JSON exists is complete.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    listing = {}
    for name, table in tables.items():
        path = folder / f"{name}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        listing[name] = {"file": path.name, "rows": table.num_rows}
    doc = {"format": fmt, **meta, "tables": listing}
    text = json.dumps(doc, indent=2, sort_keys=True)  # fails loudly on non-JSON params
    tmp = folder / (meta_file + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, folder / meta_file)
    return folder


def read_table_folder(folder: str | Path, meta_file: str, fmt: str, task: Task) -> tuple[dict, dict[str, pa.Table]]:
    """Read what `write_table_folder` wrote, checking format, files, row counts and expressions
    (of `task`)."""
    folder = Path(folder)
    path = folder / meta_file
    if not path.exists():
        raise DataError(f"{folder}: no {meta_file} (not a saved data set, or an unfinished save)")
    doc = read_json(path, DataError, meta_file)
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise DataError(f"{path}: format is {doc.get('format') if isinstance(doc, dict) else None!r}, "
                        f"expected {fmt!r}")
    tables = {}
    entries = doc.get("tables") or {}
    if not isinstance(entries, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("file"), str) and "/" not in e["file"]
            and isinstance(e.get("rows"), int) for e in entries.values()):
        raise DataError(f"{path}: 'tables' should map names to {{\"file\": a file of the folder, \"rows\": a count}}")
    for name, entry in entries.items():
        table = read_pool(folder / entry["file"], task=task)
        if table.num_rows != entry["rows"]:
            raise DataError(f"{folder / entry['file']}: {table.num_rows} rows, {meta_file} says {entry['rows']}")
        tables[name] = table
    return doc, tables

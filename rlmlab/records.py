"""Lists of flat JSON records as Parquet tables, and back, record for record.

Per-expression results, probe rows and training logs are lists of dicts of scalars, which
`records_to_table` stores column by column (zstd). The reading side gives back the same dicts:
the same keys, values and types. Two things JSON lines say that columns do not are kept in the
file's metadata: which keys some records lack (their nulls mean "absent"; where such a key is
also null in other records, a boolean column `_present.<key>` says which), and which columns
hold mixed or nested values (stored as JSON text).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rlmlab.errors import DataError, RlmlabError
from rlmlab.safeio import check_fits, parse_json, shorten

META_KEY = b"rlmlab.records"
PRESENT = "_present."
FORMAT = "rlmlab-records/1"
COMPRESSION = "zstd"
# Records are written once and read many times, and every clone downloads every committed byte:
# zstd level 19 without dictionary pages stores them in about 60% of the space of pyarrow's
# defaults (level 1, dictionaries), for about a second of CPU per megabyte written and no
# slower reading (docs/benchmarks.md).
COMPRESSION_LEVEL = 19
# Python types a column stores natively when all its non-null values share one of them.
NATIVE = (bool, int, float, str)
# The Arrow types `records_to_table` gives those columns ("null": a column with no value).
NATIVE_TYPES = frozenset({"bool", "int64", "double", "string", "null"})
# Rows a file may claim per byte it holds. The densest records rlmlab has written hold about
# 0.06 (a results file's expressions and traces do not compress away); a footer or metadata
# claiming far more describes a file its bytes could not have come from.
MAX_ROWS_PER_BYTE = 16
# What a value read back costs in Python (an object and its slot in a dict): the bound on the
# memory a file's rows will take, checked against this machine's before they are made.
VALUE_BYTES = 64


def _column_kind(values: list) -> str:
    """"native" when the non-null values share one type of `NATIVE` (or there are none),
    else "json"."""
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return "native"
    return "native" if len(kinds) == 1 and next(iter(kinds)) in NATIVE else "json"


def records_to_table(records: Sequence[dict]):
    """A pyarrow Table of `records` (dicts with string keys), whose `table_to_records` is
    `records` again; ValueError for a record that is not such a dict."""
    import pyarrow as pa

    keys: dict[str, None] = {}
    for r in records:
        if not isinstance(r, dict) or not all(isinstance(k, str) for k in r):
            raise ValueError("a record is not an object with string keys")
        keys.update(dict.fromkeys(r))
    optional, json_columns, presence, arrays, names = [], [], {}, [], []
    for k in keys:
        values = [r.get(k) for r in records]
        if any(k not in r for r in records):
            optional.append(k)
            if any(k in r and r[k] is None for r in records):  # null and absent both occur
                presence[k] = f"{PRESENT}{k}"
                while presence[k] in keys:
                    presence[k] = "_" + presence[k]
        names.append(k)
        if _column_kind(values) == "native":
            try:
                arrays.append(pa.array(values))
                continue
            except (pa.ArrowException, OverflowError):
                pass
        json_columns.append(k)
        arrays.append(pa.array([None if v is None else json.dumps(v) for v in values], type=pa.string()))
    for k, column in presence.items():
        names.append(column)
        arrays.append(pa.array([k in r for r in records], type=pa.bool_()))
    meta = {"format": FORMAT, "optional": optional, "json": json_columns, "present": presence}
    if not keys:
        return pa.table({}, metadata={META_KEY: json.dumps({**meta, "rows": len(records)})})
    return pa.Table.from_arrays(arrays, names=names, metadata={META_KEY: json.dumps(meta)})


def table_to_records(table, where: str) -> list[dict]:
    """The records `records_to_table` stored in `table`, its columns checked to be of the types
    that function writes."""
    meta = _meta(table, where)
    if table.num_columns == 0:
        return [{} for _ in range(_columnless_rows(meta, where))]
    _check_schema(table, meta, where)
    presence = meta.get("present", {})
    hidden = set(presence.values())
    names = [n for n in table.column_names if n not in hidden]
    optional, json_columns = set(meta["optional"]), set(meta["json"])
    columns = []
    for name in names:
        values = table.column(name).to_pylist()
        if name in json_columns:
            values = [None if v is None else parse_json(v, f"{where}: column {name}") for v in values]
        columns.append(values)
    present = {k: table.column(c).to_pylist() for k, c in presence.items() if c in table.column_names}
    out = []
    for i, row in enumerate(zip(*columns)):
        out.append({k: v for k, v in zip(names, row)
                    if not (v is None and k in optional and not (k in present and present[k][i]))})
    return out


def _columnless_rows(meta: dict, where: str) -> int:
    """How many (empty) records a table without columns holds: its metadata's row count."""
    rows = meta.get("rows")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise DataError(f"{where}: a table without columns needs a row count")
    return rows


def _check_schema(table, meta: dict, where: str) -> None:
    """Refuse a column `records_to_table` would not have written: a repeated name, a type other
    than a native one, JSON text that is not a string column, a presence column that is not
    boolean. Values read from such a column would reach the readers as types they never see."""
    names = table.column_names
    if len(set(names)) != len(names):
        raise DataError(f"{where}: a column name appears twice")
    presence = set(meta.get("present", {}).values())
    for field in table.schema:
        kind = str(field.type)
        wanted = ("string", "null") if field.name in meta["json"] else ("bool",) if field.name in presence else None
        if (wanted is None and kind not in NATIVE_TYPES) or (wanted is not None and kind not in wanted):
            raise DataError(f"{where}: column {shorten(field.name)!r} is of type {shorten(kind)}, "
                            f"not one rlmlab writes there ({', '.join(wanted or sorted(NATIVE_TYPES))})")


def _meta(table, where: str) -> dict:
    raw = (table.schema.metadata or {}).get(META_KEY)
    meta = parse_json(raw.decode("utf-8", "replace"), where) if raw is not None else None
    if not (isinstance(meta, dict) and meta.get("format") == FORMAT
            and all(isinstance(meta.get(k), list) and all(isinstance(x, str) for x in meta[k])
                    for k in ("optional", "json"))
            and isinstance(meta.get("present", {}), dict)
            and all(isinstance(x, str) for x in meta.get("present", {}).values())):
        raise DataError(f"{where}: not a table of records written by rlmlab (no {FORMAT} metadata)")
    return meta


def write_records(path: str | Path, records: Sequence[dict]) -> Path:
    """`records` as a zstd Parquet file at `path`, written to a temporary name and moved into
    place, so that a killed writer leaves the old file or none."""
    path = Path(path)
    _write_table(records_to_table(records), path)
    return path


def _write_table(table, path: Path) -> None:
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression=COMPRESSION, compression_level=COMPRESSION_LEVEL, use_dictionary=False)
    tmp.replace(path)


def reencode_records(path: str | Path) -> bool:
    """Rewrite a Parquet file of records with today's encoding (`COMPRESSION_LEVEL`), the same
    table read back before it replaces the file; whether its bytes changed. A file that is not
    rlmlab's records is a one-line DataError and stays as it is."""
    import pyarrow.parquet as pq

    path = Path(path)
    table = _read_table(path, DataError)
    _meta(table, str(path))  # refuses what write_records did not write
    tmp = path.with_name(path.name + ".reencoded")
    _write_table(table, tmp)
    if tmp.read_bytes() == path.read_bytes():
        tmp.unlink()
        return False
    if not pq.read_table(tmp).equals(table, check_metadata=True):
        tmp.unlink()
        raise DataError(f"{path}: its table does not come back unchanged from a new encoding; left as it is")
    tmp.replace(path)
    return True


def _read_table(path: Path, error: type[RlmlabError], columns: list[str] | None = None):
    """The Parquet table at `path` (only `columns`, when given, of those it has) with the file's
    own metadata; a missing, damaged or truncated file is one-line `error`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise error(f"{path}: no such file")
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        _check_size(pf, path, error, len(names if columns is None else [c for c in columns if c in names]))
        table = pf.read(columns=[c for c in columns if c in names] if columns is not None else None)
        # A damaged page can still decode: full validation finds what it broke (text that is not
        # UTF-8, offsets out of range) here, rather than as a traceback when a value is read.
        table.validate(full=True)
        # the file's own metadata, which a read of some columns keeps
        return table.replace_schema_metadata(pf.schema_arrow.metadata)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise error(f"{path}: not a readable Parquet file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def _check_size(pf, path: Path, error: type[RlmlabError], n_columns: int) -> None:
    """Refuse, from the footer and before any row is read, a file that claims more rows than its
    bytes could hold (`MAX_ROWS_PER_BYTE`; for a table without columns, the row count of its
    metadata), or whose rows would not fit in this machine's memory once read."""
    size = path.stat().st_size
    rows = pf.metadata.num_rows
    if not pf.schema_arrow.names:
        raw = (pf.schema_arrow.metadata or {}).get(META_KEY)
        meta = parse_json(raw.decode("utf-8", "replace"), str(path)) if raw is not None else None
        claimed = meta.get("rows") if isinstance(meta, dict) else None
        rows = claimed if isinstance(claimed, int) and not isinstance(claimed, bool) else rows
    if rows < 0 or rows > MAX_ROWS_PER_BYTE * size:
        raise error(f"{path}: claims {rows:,} rows, more than a file of {size:,} bytes can hold; "
                    "not a file rlmlab wrote")
    check_fits(rows * (n_columns + 1) * VALUE_BYTES, f"{path}: reading {rows:,} rows", error)


def read_records(path: str | Path, error: type[RlmlabError] = DataError, columns: list[str] | None = None) -> list[dict]:
    """The records of a Parquet file `write_records` wrote (only `columns`, when given, of those
    it has); a damaged, truncated or foreign file is one-line `error`."""
    path = Path(path)
    table = _read_table(path, error, columns)
    try:
        return table_to_records(table, str(path))
    except DataError as e:
        raise error(str(e)) from None

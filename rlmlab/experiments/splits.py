"""Experiment splits of an expression pool: IID sample-size sweep and length/depth thresholds.

Everything here is a pure function of (pool, parameters, seed); a `Split` is saved to and
loaded from a folder of parquet tables plus one JSON file, so experiment runs can resume.

Duplicates. A pool can hold the same written expression more than once (the seed-42 pool
of 500,000 has 418,474 distinct texts). All splits walk the pool in one seeded permutation
and keep the *first* row of each text they take, so:

- no text is ever in two of train / val / test / eval;
- threshold splits are fully deduplicated (every table holds distinct texts);
- the IID split deduplicates its training pool by default (the paper trains on "N distinct
  expressions"); `dedupe_train=False` keeps repeated draws of a training text, which is the
  only way the 500k pool reaches the paper's N = 450,000 (418,474 distinct - 6,000 held out
  = 412,474 < 450,000). Held-out texts are still never in training.

Held-out rows are taken by row, not by distinct text, so frequent expressions are as likely
to be held out as the generator makes them.

Bins. Evaluation expressions of a threshold split are grouped by the multiplier
r = value / threshold (`trace_len / L` or `max_depth / K`) into the paper's fixed bins,
each a half-open interval lo < r <= hi compared exactly (integers, no floats):

- length: the paper's labels are the intervals themselves,
  (0, .25] (.25, .5] (.5, 1] | (1, 1.25] (1.25, 1.5] (1.5, 2] (2, 2.5] (2.5, 3] (3, 5] (5, inf)
- depth: the paper's labels (<=0.3, 0.4-0.6, 0.7-1.0 | 1.1, 1.2-1.3, ..., 2.0-2.1, >=2.2) name
  d/K rounded to one decimal, so the edges sit half-way between tenths:
  (0, .35] (.35, .65] (.65, 1] | (1, 1.15] (1.15, 1.35] (1.35, 1.55] (1.55, 1.75] (1.75, 1.95]
  (1.95, 2.15] (2.15, inf). For K=10 every bin holds exactly the depths its label names
  (d=11 -> "1.1", d=22 -> ">=2.2"); for other K a depth goes to the bin of its rounded ratio
  (K=9, d=10: 1.11 -> "1.1"; K=7, d=8: 1.14 -> "1.1"), and bins that no integer depth rounds
  into stay empty (K=5 has no "1.1").
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rlmlab.errors import ConfigError, DataError
from rlmlab.safeio import parse_json
from rlmlab.task.pool import read_table_folder, write_table_folder
from rlmlab.task.taskfile import Task

IID_SIZES: tuple[int, ...] = (100, 200, 300, 500, 1_000, 2_000, 3_000, 5_000, 10_000, 20_000, 30_000,
                              50_000, 100_000, 200_000, 300_000, 450_000)
"""The paper's nested training-set sizes for the IID sample-complexity sweep."""
LENGTH_THRESHOLDS: tuple[int, ...] = (33, 96, 197, 359, 595, 1060, 1345, 1839)
"""The paper's length thresholds L (executed trace length, written expression included)."""
DEPTH_THRESHOLDS: tuple[int, ...] = (3, 5, 7, 9, 10)
"""The paper's depth thresholds K (maximum stack depth, root frame = 1)."""
REPRESENTATIVE = {"length": 595, "depth": 10}
"""The thresholds of the paper's main-text per-bin table."""

PER_BIN_CAP = 310
"""Default evaluation expressions per bin: ten full bins give the paper's 3,100."""

SplitKind = Literal["iid", "length", "depth"]
_COLUMN = {"length": "trace_len", "depth": "max_depth"}
_NEEDED = ("expr", "trace_len", "max_depth", "max_frame_width")
FORMAT = "rlmlab.split/1"


# --- bins ---------------------------------------------------------------------

@dataclass(frozen=True)
class Bin:
    """One multiplier bin of a threshold split: the rows with lo < value/threshold <= hi."""

    index: int
    """Position in table order (0 = leftmost column of the paper's table)."""
    label: str
    """The paper's column header, in ASCII ("0.25-0.5", ">=2.2")."""
    lo: Fraction
    """Exclusive lower edge of the multiplier."""
    hi: Fraction | None
    """Inclusive upper edge of the multiplier; None for the open last bin."""
    ood: bool
    """True for bins above the threshold (the OOD columns), False for the IID ones."""

    def contains(self, value: int, threshold: int) -> bool:
        """Exact test of lo < value/threshold <= hi in integers."""
        above_lo = value * self.lo.denominator > threshold * self.lo.numerator
        below_hi = self.hi is None or value * self.hi.denominator <= threshold * self.hi.numerator
        return above_lo and below_hi


def _bins(edges: Sequence[str], labels: Sequence[str], n_iid: int) -> tuple[Bin, ...]:
    lows = ["0"] + list(edges)
    highs = list(edges) + [None]
    return tuple(Bin(i, lab, Fraction(lo), None if hi is None else Fraction(hi), i >= n_iid)
                 for i, (lab, lo, hi) in enumerate(zip(labels, lows, highs)))


LENGTH_BINS: tuple[Bin, ...] = _bins(
    ["0.25", "0.5", "1", "1.25", "1.5", "2", "2.5", "3", "5"],
    ["<=0.25", "0.25-0.5", "0.5-1.0", "1.0-1.25", "1.25-1.5", "1.5-2.0", "2.0-2.5", "2.5-3.0", "3.0-5.0",
     ">5.0"], 3)
"""Length bins of trace_len / L, in the paper's table order."""
DEPTH_BINS: tuple[Bin, ...] = _bins(
    ["0.35", "0.65", "1", "1.15", "1.35", "1.55", "1.75", "1.95", "2.15"],
    ["<=0.3", "0.4-0.6", "0.7-1.0", "1.1", "1.2-1.3", "1.4-1.5", "1.6-1.7", "1.8-1.9", "2.0-2.1", ">=2.2"], 3)
"""Depth bins of max_depth / K (ratio rounded to one decimal), in the paper's table order."""


@dataclass(frozen=True)
class Threshold:
    """A length or depth threshold: which column it splits on and how it bins."""

    kind: Literal["length", "depth"]
    """"length" splits on trace_len, "depth" on max_depth."""
    value: int
    """L or K: rows with column <= value are on the training (IID) side."""

    def __post_init__(self):
        if self.kind not in _COLUMN:
            raise ConfigError(f"threshold kind must be 'length' or 'depth', got {self.kind!r}")
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 1:
            raise ConfigError(f"{self.kind} threshold must be a positive integer, got {self.value!r}")

    @property
    def column(self) -> str:
        return _COLUMN[self.kind]

    @property
    def bins(self) -> tuple[Bin, ...]:
        return LENGTH_BINS if self.kind == "length" else DEPTH_BINS

    def ratio(self, row: Mapping) -> Fraction:
        return Fraction(int(row[self.column]), self.value)

    def is_ood(self, row: Mapping) -> bool:
        return int(row[self.column]) > self.value

    def bin_of_value(self, value: int) -> Bin:
        for b in self.bins:
            if b.contains(value, self.value):
                return b
        raise DataError(f"{self.column}={value} is not positive; no bin holds it")


def bin_of(row: Mapping, split: "Split | Threshold") -> Bin:
    """The bin of a row (any mapping with `trace_len` / `max_depth`) under a threshold split."""
    th = split if isinstance(split, Threshold) else split.threshold
    if th is None:
        raise DataError(f"split {split.name!r} is not a threshold split; it has no bins")
    return th.bin_of_value(int(row[th.column]))


def bin_labels(kind: str) -> list[tuple[str, bool]]:
    """(label, is_ood) of every bin of a 'length' or 'depth' split, in table order."""
    return [(b.label, b.ood) for b in Threshold(kind, 1).bins]


# --- the Split ----------------------------------------------------------------

@dataclass
class Split:
    """One experiment's data: tables of pool rows (same columns as the pool, plus bin columns in
    the evaluation tables of threshold splits) and the parameters that rebuild it."""

    name: str
    """"iid", "length-595", "depth-10", ..."""
    kind: SplitKind
    """"iid", "length" or "depth"."""
    params: dict
    """JSON-serialisable: seed, counts, threshold, T_max, per-bin counts, pool fingerprint."""
    train: pa.Table
    """Training expressions in a fixed random order; every prefix is a random subset, so the
    IID sweep's N-subsets are `train[:N]` (nested by construction)."""
    val: pa.Table
    """Validation expressions (checkpoint selection), same distribution as training."""
    test: pa.Table
    """Held-out IID test: 5,000 random expressions (IID split) or the below-threshold bins of
    `eval` (threshold splits)."""
    eval: pa.Table | None = None
    """Threshold splits only: every evaluation expression with `bin`, `bin_index`, `ood`,
    `ratio` and `within_tmax`, IID bins then OOD bins, in table order."""

    @property
    def threshold(self) -> Threshold | None:
        return None if self.kind == "iid" else Threshold(self.kind, int(self.params["threshold"]))

    @property
    def bins(self) -> tuple[Bin, ...]:
        th = self.threshold
        return () if th is None else th.bins

    def train_subset(self, n: int) -> pa.Table:
        """The first `n` training expressions (the nested IID subset of size n)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"training-set size must be a positive integer, got {n!r}")
        if n > self.train.num_rows:
            hint = ("; build the split with dedupe_train=False to keep repeated draws"
                    if self.kind == "iid" and self.params.get("dedupe_train") else "")
            raise DataError(f"split {self.name!r} has {self.train.num_rows} training expressions; "
                            f"cannot take N={n}{hint}")
        return self.train.slice(0, n)

    def nested_subsets(self, sizes: Sequence[int] = IID_SIZES) -> dict[int, pa.Table]:
        """{N: train[:N]} for every requested size; any size above the pool is refused."""
        return {n: self.train_subset(n) for n in sorted(sizes)}

    def eval_bin(self, label: str) -> pa.Table:
        """The evaluation rows of one bin (by its label)."""
        if self.eval is None:
            raise DataError(f"split {self.name!r} has no binned evaluation set")
        if label not in {b.label for b in self.bins}:
            raise DataError(f"no bin {label!r} in a {self.kind} split")
        mask = [b == label for b in self.eval.column("bin").to_pylist()]
        return self.eval.filter(pa.array(mask, pa.bool_()))

    # -- persistence --

    def tables(self) -> dict[str, pa.Table]:
        out = {"train": self.train, "val": self.val, "test": self.test}
        if self.eval is not None:
            out["eval"] = self.eval
        return out

    def save(self, folder: str | Path) -> Path:
        """Write `<folder>/{train,val,test[,eval]}.parquet` and `split.json` (written last)."""
        return write_table_folder(folder, "split.json", FORMAT,
                                  {"name": self.name, "kind": self.kind, "params": self.params},
                                  self.tables())

    @classmethod
    def load(cls, folder: str | Path, task: Task) -> "Split":
        """A saved split of `task`'s expressions (another task's is refused)."""
        meta, tables = read_table_folder(folder, "split.json", FORMAT, task)
        try:
            name, kind, params = meta["name"], meta["kind"], meta["params"]
        except KeyError as e:
            raise DataError(f"{folder}: split.json lacks {e.args[0]!r}") from None
        if kind not in ("iid", "length", "depth"):
            raise DataError(f"{folder}: unknown split kind {kind!r}")
        for t in ("train", "val", "test"):
            if t not in tables:
                raise DataError(f"{folder}: split has no {t!r} table")
        if kind != "iid" and "eval" not in tables:
            raise DataError(f"{folder}: a {kind} split needs an 'eval' table")
        return cls(name, kind, params, tables["train"], tables["val"], tables["test"], tables.get("eval"))


# --- building -----------------------------------------------------------------

def first_per_bin(bins: Sequence, n: int) -> list[int]:
    """Indices of the first `n` rows of each bin, in row order (rows without a bin, None, are
    one bin)."""
    taken: dict = {}
    kept = []
    for i, b in enumerate(bins):
        if taken.get(b, 0) < n:
            taken[b] = taken.get(b, 0) + 1
            kept.append(i)
    return kept


def sample_eval_file(path: str | Path, n: int) -> Path:
    """The first `n` expressions of each bin of an evaluation file (of the file, when it has no
    `bin` column), written beside it as `<name>.first<n>.parquet`; the file is left as it is."""
    path = Path(path)
    table = pq.read_table(path)
    bins = table.column("bin").to_pylist() if "bin" in table.column_names else [None] * table.num_rows
    dest = path.with_name(f"{path.stem}.first{n}.parquet")
    pq.write_table(table.take(first_per_bin(bins, n)), dest)
    return dest


def pool_fingerprint(pool: pa.Table) -> str:
    """SHA-256 over the pool's expression texts in order: identifies the pool a split came from."""
    h = hashlib.sha256()
    for text in pool.column("expr").to_pylist():
        h.update(text.encode())
        h.update(b"\n")
    return h.hexdigest()


def _check_pool(pool: pa.Table) -> None:
    missing = [c for c in _NEEDED if c not in pool.column_names]
    if missing:
        raise DataError(f"pool lacks column(s) {', '.join(missing)} (has {', '.join(pool.column_names)})")
    if pool.num_rows == 0:
        raise DataError("pool is empty")


def _count(name: str, n, minimum: int = 0) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {n!r}")
    return n


def _pool_meta(pool: pa.Table) -> dict:
    meta = (pool.schema.metadata or {}).get(b"rlmlab.task.pool")
    info = parse_json(meta, "pool metadata") if meta else {}
    if not isinstance(info, dict):
        raise DataError("pool metadata is not a JSON object")
    return {"rows": pool.num_rows, "fingerprint": pool_fingerprint(pool), **info}


def _take(pool: pa.Table, rows: Sequence[int]) -> pa.Table:
    return pool.take(pa.array(rows, pa.int64()))


def iid_split(pool: pa.Table, *, n_test: int = 5_000, n_val: int = 1_000, seed: int = 0,
              dedupe_train: bool = True, max_trace_len: int | None = None) -> Split:
    """The IID split: `n_test` test and `n_val` validation expressions held out, the rest training.

    With `max_trace_len` only the pool's expressions whose trace has at most that many tokens
    take part (a smaller generator distribution for a small model; the paper uses the whole).

    Rows are walked in one permutation drawn from `seed`: the first `n_test` distinct texts
    are the test set, the next `n_val` distinct texts the validation set, and every later row
    whose text is not held out is training (its first copy only, unless `dedupe_train=False`).
    """
    _check_pool(pool)
    _count("n_test", n_test, 1)
    _count("n_val", n_val, 1)
    pool_meta = _pool_meta(pool)
    if max_trace_len is not None:
        _count("max_trace_len", max_trace_len, 1)
        pool = pool.filter(pc.less_equal(pool.column("trace_len"), max_trace_len))
    texts = pool.column("expr").to_pylist()
    order = list(range(len(texts)))
    random.Random(f"rlmlab-split:iid:{seed}").shuffle(order)
    test: list[int] = []
    val: list[int] = []
    held: set[str] = set()
    pos = 0
    for want, into in ((n_test, test), (n_val, val)):
        while len(into) < want and pos < len(order):
            i = order[pos]
            pos += 1
            if texts[i] not in held:
                held.add(texts[i])
                into.append(i)
    if len(val) < n_val:
        raise DataError(f"pool has {len(held)} distinct expressions; cannot hold out "
                        f"{n_test} test + {n_val} validation")
    train: list[int] = []
    seen: set[str] = set()
    for i in order[pos:]:
        t = texts[i]
        if t in held or (dedupe_train and t in seen):
            continue
        seen.add(t)
        train.append(i)
    if not train:
        raise DataError("no training expressions left after holding out test and validation")
    params = {"seed": seed, "n_test": n_test, "n_val": n_val, "dedupe_train": dedupe_train,
              "n_train": len(train), "max_train_size": max((n for n in IID_SIZES if n <= len(train)), default=0),
              "max_trace_len": max_trace_len, "pool": pool_meta}
    return Split("iid", "iid", params, _take(pool, train), _take(pool, val), _take(pool, test))


def threshold_split(pool: pa.Table, kind: Literal["length", "depth"], threshold: int, *,
                    n_val: int = 1_000, per_bin_cap: int = PER_BIN_CAP, n_train: int | None = None,
                    seed: int = 0) -> Split:
    """A length or depth split: train/val/IID test below the threshold, OOD test above it.

    The pool is deduplicated by text and walked in one permutation drawn from `seed`. Below
    the threshold: the first `n_val` rows are validation; then each IID bin takes its first
    `per_bin_cap` rows (the held-out IID test); every other row is training, in permutation
    order (`n_train` keeps only the first n_train of them). Above it, each OOD bin takes its
    first `per_bin_cap` rows. T_max is the widest active frame among the training rows;
    every evaluation row records whether its own widest frame is within it.
    """
    _check_pool(pool)
    th = Threshold(kind, threshold)
    _count("n_val", n_val, 1)
    _count("per_bin_cap", per_bin_cap, 1)
    if n_train is not None:
        _count("n_train", n_train, 1)
    texts = pool.column("expr").to_pylist()
    values = pool.column(th.column).to_pylist()
    order = list(range(len(texts)))
    random.Random(f"rlmlab-split:{kind}:{threshold}:{seed}").shuffle(order)

    seen: set[str] = set()
    below: list[int] = []
    above: list[int] = []
    for i in order:
        if texts[i] in seen:
            continue
        seen.add(texts[i])
        (above if values[i] > threshold else below).append(i)

    bin_cache: dict[int, Bin] = {}

    def bin_index(i: int) -> int:
        v = values[i]
        if v not in bin_cache:
            bin_cache[v] = th.bin_of_value(v)
        return bin_cache[v].index

    nbins = len(th.bins)
    available = [0] * nbins
    picked: list[list[int]] = [[] for _ in range(nbins)]
    val, train = below[:n_val], []
    for i in below[n_val:]:
        b = bin_index(i)
        available[b] += 1
        if len(picked[b]) < per_bin_cap:
            picked[b].append(i)
        else:
            train.append(i)
    for i in above:
        b = bin_index(i)
        available[b] += 1
        if len(picked[b]) < per_bin_cap:
            picked[b].append(i)
    if len(val) < n_val or not train:
        raise DataError(f"{th.kind} split at {threshold}: {len(below)} distinct expressions below the threshold "
                        f"are too few for {n_val} validation + up to {3 * per_bin_cap} IID test + training")
    if n_train is not None:
        if n_train > len(train):
            raise DataError(f"{th.kind} split at {threshold}: {len(train)} training expressions available, "
                            f"cannot take n_train={n_train}")
        train = train[:n_train]

    widths = pool.column("max_frame_width").to_pylist()
    t_max = max(widths[i] for i in train)
    eval_rows = [i for b in range(nbins) for i in picked[b]]
    bins = th.bins
    eval_table = _take(pool, eval_rows)
    cols = {
        "bin": pa.array([bins[bin_index(i)].label for i in eval_rows], pa.string()),
        "bin_index": pa.array([bin_index(i) for i in eval_rows], pa.int8()),
        "ood": pa.array([bins[bin_index(i)].ood for i in eval_rows], pa.bool_()),
        "ratio": pa.array([values[i] / threshold for i in eval_rows], pa.float64()),
        "within_tmax": pa.array([widths[i] <= t_max for i in eval_rows], pa.bool_()),
    }
    for name, col in cols.items():
        eval_table = eval_table.append_column(name, col)
    eval_table = eval_table.replace_schema_metadata(pool.schema.metadata)
    n_iid = sum(len(picked[b.index]) for b in bins if not b.ood)
    test = eval_table.slice(0, n_iid)
    params = {
        "threshold": threshold, "seed": seed, "n_val": n_val, "per_bin_cap": per_bin_cap,
        "n_train": len(train), "n_train_requested": n_train, "t_max": t_max,
        "distinct_below": len(below), "distinct_above": len(above),
        "bins": [{"label": b.label, "ood": b.ood, "lo": str(b.lo), "hi": None if b.hi is None else str(b.hi),
                  "available": available[b.index], "sampled": len(picked[b.index])} for b in bins],
        "pool": _pool_meta(pool),
    }
    return Split(f"{kind}-{threshold}", kind, params, _take(pool, train), _take(pool, val), test, eval_table)


def without_ood(params: Mapping) -> str | None:
    """Why a threshold split (its `params`) can say nothing out of domain, or None: no pool
    expression lies above its threshold (a threshold beyond the pool's longest or deepest), so
    its evaluation set is in-domain only and its report has no out-of-domain column."""
    bins = [b for b in params.get("bins") or () if isinstance(b, Mapping)]
    if not bins or any(b.get("ood") and b.get("sampled") for b in bins):
        return None
    n_iid = sum(b.get("sampled") or 0 for b in bins if not b.get("ood"))
    return (f"no expression of the pool lies above the threshold {params.get('threshold')}: the evaluation set "
            f"holds {n_iid} in-domain expressions and no out-of-domain bin")


def length_split(pool: pa.Table, L: int, **kwargs) -> Split:
    """`threshold_split(pool, "length", L, ...)`."""
    return threshold_split(pool, "length", L, **kwargs)


def depth_split(pool: pa.Table, K: int, **kwargs) -> Split:
    """`threshold_split(pool, "depth", K, ...)`."""
    return threshold_split(pool, "depth", K, **kwargs)


def paper_splits(pool: pa.Table, seed: int = 0, **kwargs) -> dict[str, Split]:
    """Every threshold split of the paper's sweep (8 lengths, 5 depths), by name."""
    out = {}
    for kind, thresholds in (("length", LENGTH_THRESHOLDS), ("depth", DEPTH_THRESHOLDS)):
        for t in thresholds:
            s = threshold_split(pool, kind, t, seed=seed, **kwargs)
            out[s.name] = s
    return out


__all__ = ["IID_SIZES", "LENGTH_THRESHOLDS", "DEPTH_THRESHOLDS", "REPRESENTATIVE", "PER_BIN_CAP",
           "Bin", "LENGTH_BINS", "DEPTH_BINS", "Threshold", "bin_of", "bin_labels", "Split",
           "iid_split", "threshold_split", "length_split", "depth_split", "paper_splits", "without_ood",
           "pool_fingerprint"]

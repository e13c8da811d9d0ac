"""Experiment splits: IID disjointness and nesting, threshold sides, bins at their edges, persistence."""

import json
from fractions import Fraction

import pytest

from rlmlab.errors import ConfigError, DataError
from rlmlab.experiments.splits import (
    DEPTH_BINS,
    DEPTH_THRESHOLDS,
    IID_SIZES,
    LENGTH_BINS,
    LENGTH_THRESHOLDS,
    Split,
    Threshold,
    bin_labels,
    bin_of,
    depth_split,
    iid_split,
    length_split,
    threshold_split,
)
from rlmlab.task.pool import build_pool
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


@pytest.fixture(scope="module")
def pool():
    return build_pool(12_000, 5, workers=1, task=PAPER)


def texts(table):
    return table.column("expr").to_pylist()


# --- IID --------------------------------------------------------------------------

def test_iid_split_is_disjoint_nested_and_deterministic(pool):
    s = iid_split(pool, n_test=500, n_val=100, seed=3)
    train, val, test = texts(s.train), texts(s.val), texts(s.test)
    assert (len(test), len(val)) == (500, 100)
    assert len(set(test)) == 500 and len(set(val)) == 100 and len(set(train)) == len(train)
    assert not set(train) & set(val) and not set(train) & set(test) and not set(val) & set(test)
    # every distinct text of the pool is somewhere (dedupe keeps one copy, drops none)
    assert set(train) | set(val) | set(test) == set(texts(pool))
    sizes = [n for n in IID_SIZES if n <= s.train.num_rows]
    subsets = s.nested_subsets(sizes)
    for small, large in zip(sizes, sizes[1:]):
        assert set(texts(subsets[small])) <= set(texts(subsets[large]))
        assert texts(subsets[large])[:small] == texts(subsets[small])
    again = iid_split(pool, n_test=500, n_val=100, seed=3)
    assert again.train.equals(s.train) and again.test.equals(s.test)
    assert texts(iid_split(pool, n_test=500, n_val=100, seed=4).test) != test


def test_iid_refuses_sizes_beyond_the_pool(pool):
    s = iid_split(pool, n_test=500, n_val=100)
    with pytest.raises(DataError, match="training expressions; cannot take N=450000.*dedupe_train=False"):
        s.train_subset(450_000)
    with pytest.raises(DataError, match="cannot take"):
        s.nested_subsets(IID_SIZES)
    with pytest.raises(ConfigError):
        s.train_subset(0)
    with pytest.raises(DataError, match="cannot hold out"):
        iid_split(pool.slice(0, 50), n_test=40, n_val=20)


def test_iid_split_of_short_traces_draws_only_from_them(pool):
    s = iid_split(pool, n_test=200, n_val=50, max_trace_len=60)
    lengths = [n for t in (s.train, s.val, s.test) for n in t.column("trace_len").to_pylist()]
    assert max(lengths) <= 60 and s.params["max_trace_len"] == 60
    short = {t for t, n in zip(texts(pool), pool.column("trace_len").to_pylist()) if n <= 60}
    assert set(texts(s.train)) | set(texts(s.val)) | set(texts(s.test)) == short
    assert s.params["pool"]["rows"] == pool.num_rows  # the source pool, not the filtered one
    with pytest.raises(ConfigError, match="max_trace_len must be an integer >= 1"):
        iid_split(pool, n_test=200, n_val=50, max_trace_len=0)


def test_iid_keeping_repeats_never_leaks_held_out_texts(pool):
    s = iid_split(pool, n_test=500, n_val=100, dedupe_train=False)
    train = texts(s.train)
    held = set(texts(s.val)) | set(texts(s.test))
    assert not held & set(train)
    assert len(train) > len(set(train))  # repeated draws kept
    assert len(train) == pool.num_rows - sum(t in held for t in texts(pool))


# --- bins ---------------------------------------------------------------------------

@pytest.mark.parametrize("value,label", [
    (1, "<=0.25"), (25, "<=0.25"), (26, "0.25-0.5"), (50, "0.25-0.5"), (51, "0.5-1.0"), (100, "0.5-1.0"),
    (101, "1.0-1.25"), (125, "1.0-1.25"), (126, "1.25-1.5"), (150, "1.25-1.5"), (151, "1.5-2.0"),
    (200, "1.5-2.0"), (201, "2.0-2.5"), (250, "2.0-2.5"), (251, "2.5-3.0"), (300, "2.5-3.0"),
    (301, "3.0-5.0"), (500, "3.0-5.0"), (501, ">5.0"), (10_000, ">5.0")])
def test_length_bins_at_their_edges(value, label):
    b = bin_of({"trace_len": value}, Threshold("length", 100))
    assert b.label == label and b.ood == (value > 100)


@pytest.mark.parametrize("depth,label", [
    (1, "<=0.3"), (3, "<=0.3"), (4, "0.4-0.6"), (6, "0.4-0.6"), (7, "0.7-1.0"), (10, "0.7-1.0"), (11, "1.1"),
    (12, "1.2-1.3"), (13, "1.2-1.3"), (14, "1.4-1.5"), (15, "1.4-1.5"), (16, "1.6-1.7"), (17, "1.6-1.7"),
    (18, "1.8-1.9"), (19, "1.8-1.9"), (20, "2.0-2.1"), (21, "2.0-2.1"), (22, ">=2.2"), (40, ">=2.2")])
def test_depth_bins_for_k10_hold_exactly_the_labelled_depths(depth, label):
    assert bin_of({"max_depth": depth}, Threshold("depth", 10)).label == label


def _rounded_label(ratio: Fraction) -> str:
    """The depth label a ratio gets when rounded to one decimal (round half down), as in the paper."""
    tenth = -((-ratio * 10 + Fraction(1, 2)) // 1)  # ceil(10 r - 1/2): nearest tenth, ties down
    if ratio <= 1:
        return "<=0.3" if tenth <= 3 else "0.4-0.6" if tenth <= 6 else "0.7-1.0"
    tenth = max(tenth, 11)  # 1.0 < r rounds to 1.0 only for r <= 1.05: still the first OOD bin
    groups = {11: "1.1", 12: "1.2-1.3", 13: "1.2-1.3", 14: "1.4-1.5", 15: "1.4-1.5", 16: "1.6-1.7", 17: "1.6-1.7",
              18: "1.8-1.9", 19: "1.8-1.9", 20: "2.0-2.1", 21: "2.0-2.1"}
    return groups.get(int(tenth), ">=2.2")


@pytest.mark.parametrize("k", DEPTH_THRESHOLDS)
def test_depth_bins_for_every_paper_k_follow_the_rounded_ratio(k):
    previous = -1
    for d in range(1, 4 * k + 3):
        b = bin_of({"max_depth": d}, Threshold("depth", k))
        assert b.label == _rounded_label(Fraction(d, k)), (k, d)
        assert b.ood == (d > k) and b.index >= previous
        previous = b.index
    assert bin_of({"max_depth": 10}, Threshold("depth", 9)).label == "1.1"
    assert bin_of({"max_depth": 8}, Threshold("depth", 7)).label == "1.1"


def test_bin_tables_match_the_paper_order():
    assert [lab for lab, _ in bin_labels("length")] == [b.label for b in LENGTH_BINS] == [
        "<=0.25", "0.25-0.5", "0.5-1.0", "1.0-1.25", "1.25-1.5", "1.5-2.0", "2.0-2.5", "2.5-3.0", "3.0-5.0", ">5.0"]
    assert [lab for lab, _ in bin_labels("depth")] == [b.label for b in DEPTH_BINS] == [
        "<=0.3", "0.4-0.6", "0.7-1.0", "1.1", "1.2-1.3", "1.4-1.5", "1.6-1.7", "1.8-1.9", "2.0-2.1", ">=2.2"]
    for kind in ("length", "depth"):
        assert [ood for _, ood in bin_labels(kind)] == [False] * 3 + [True] * 7
    with pytest.raises(ConfigError):
        Threshold("width", 3)
    with pytest.raises(ConfigError):
        Threshold("depth", 0)


# --- threshold splits ---------------------------------------------------------------------

@pytest.mark.parametrize("kind,threshold", [("length", 197), ("length", 33), ("depth", 5), ("depth", 10)])
def test_threshold_split_sides_bins_and_tmax(pool, kind, threshold):
    s = threshold_split(pool, kind, threshold, n_val=300, per_bin_cap=60, seed=1)
    col = "trace_len" if kind == "length" else "max_depth"
    assert s.name == f"{kind}-{threshold}" and s.threshold == Threshold(kind, threshold)
    for table in (s.train, s.val, s.test):
        assert all(v <= threshold for v in table.column(col).to_pylist())
    rows = s.eval.to_pylist()
    for r in rows:
        b = bin_of(r, s)
        assert r["bin"] == b.label and r["bin_index"] == b.index and r["ood"] == b.ood
        assert r["ood"] == (r[col] > threshold)
        assert r["within_tmax"] == (r["max_frame_width"] <= s.params["t_max"])
    assert [r["bin_index"] for r in rows] == sorted(r["bin_index"] for r in rows)  # table order
    assert s.params["t_max"] == max(s.train.column("max_frame_width").to_pylist())
    assert texts(s.test) == [r["expr"] for r in rows if not r["ood"]]
    counts = {b["label"]: b for b in s.params["bins"]}
    for b in s.bins:
        got = s.eval_bin(b.label).num_rows
        assert got == counts[b.label]["sampled"] == min(60, counts[b.label]["available"])
    every = texts(s.train) + texts(s.val) + texts(s.eval)
    assert len(every) == len(set(every))  # deduplicated: no text twice anywhere
    below = {r["expr"] for r in pool.select(["expr", col]).to_pylist() if r[col] <= threshold}
    assert set(texts(s.train)) | set(texts(s.val)) | set(texts(s.test)) == below  # nothing below is lost
    assert s.eval.num_rows > 0 and any(r["ood"] for r in rows)


def test_threshold_split_training_prefix_and_refusals(pool):
    full = length_split(pool, 359, n_val=200, per_bin_cap=50)
    part = length_split(pool, 359, n_val=200, per_bin_cap=50, n_train=1000)
    assert texts(part.train) == texts(full.train)[:1000]
    assert part.params["t_max"] == max(part.train.column("max_frame_width").to_pylist())
    with pytest.raises(DataError, match="cannot take n_train"):
        length_split(pool, 359, n_train=10**7)
    with pytest.raises(DataError, match="too few"):
        depth_split(pool.slice(0, 200), 3, n_val=1000)
    with pytest.raises(DataError, match="not a threshold split"):
        bin_of({"trace_len": 3}, iid_split(pool, n_test=100, n_val=100))
    with pytest.raises(DataError, match="lacks column"):
        length_split(pool.select(["id", "expr"]), 33)


# --- persistence --------------------------------------------------------------------------

def test_splits_save_and_load(pool, tmp_path):
    for s in (iid_split(pool, n_test=200, n_val=100), depth_split(pool, 7, n_val=200, per_bin_cap=40)):
        folder = s.save(tmp_path / s.name)
        t = Split.load(folder, task=PAPER)
        assert (t.name, t.kind, t.params) == (s.name, s.kind, json.loads(json.dumps(s.params)))
        for name, table in s.tables().items():
            assert t.tables()[name].equals(table), name
        assert [b.label for b in t.bins] == [b.label for b in s.bins]
    assert Split.load(tmp_path / "iid", task=PAPER).train_subset(50).equals(iid_split(pool, n_test=200, n_val=100).train_subset(50))


def test_load_refuses_incomplete_or_foreign_folders(pool, tmp_path):
    with pytest.raises(DataError, match="no split.json"):
        Split.load(tmp_path / "nothing", task=PAPER)
    folder = iid_split(pool, n_test=100, n_val=100).save(tmp_path / "s")
    meta = json.loads((folder / "split.json").read_text())
    meta["tables"]["train"]["rows"] += 1
    (folder / "split.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="rows"):
        Split.load(folder, task=PAPER)
    (folder / "split.json").write_text(json.dumps({"format": "something/9"}))
    with pytest.raises(DataError, match="format"):
        Split.load(folder, task=PAPER)
    (folder / "split.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        Split.load(folder, task=PAPER)


@pytest.mark.slow
def test_every_paper_threshold_on_a_large_pool():
    from rlmlab.experiments.splits import paper_splits

    pool = build_pool(100_000, 42, workers=2, task=PAPER)
    splits = paper_splits(pool, n_val=1000, per_bin_cap=310)
    assert len(splits) == len(LENGTH_THRESHOLDS) + len(DEPTH_THRESHOLDS)
    for s in splits.values():
        th = s.threshold
        assert all(v <= th.value for v in s.train.column(th.column).to_pylist())
        assert all(r["ood"] == (r[th.column] > th.value) for r in s.eval.to_pylist())
        assert s.eval.num_rows <= 3100
    assert splits["length-595"].eval.num_rows == 3100 and splits["depth-10"].eval.num_rows == 3100

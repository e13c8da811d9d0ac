"""Records as Parquet (rlmlab.records, rlmlab.measuring.result_files, rlmlab.runlog): any list of
flat records comes back as it went in; per-expression results keep their traces apart and read
back whole; `rlmlab convert` turns a committed folder's JSON lines into Parquet without losing a
record or changing a byte of its report; a damaged Parquet file is one line, never a traceback."""

import json
import math
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import one_line_error
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_report import assert_report_regenerates

from rlmlab.cli import main
from rlmlab.errors import DataError
from rlmlab.measuring.result_files import has_results, read_results, results_file, write_results, write_rows
from rlmlab.records import read_records, records_to_table, reencode_records, table_to_records, write_records
from rlmlab.runlog import has_metrics, metrics_file, read_metrics

RESULTS = Path(__file__).resolve().parents[1] / "results"
SMALL = "length-197-small"  # a small committed folder: two runs, their evaluations and probes


def same(a, b) -> bool:
    """`a == b` with NaN equal to NaN and types told apart (1, 1.0 and True are three values)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


# --- any records, round trip --------------------------------------------------------------------

# Keys a results file uses, one a presence column of another would be named after, and the empty key.
KEYS = st.sampled_from(["expr", "correct", "a", "b", "trace", "row", "_present.a", "__present.a", ""])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                            max_size=3), max_leaves=6)
TYPED = {"int": st.integers(-2**63, 2**63 - 1), "float": st.floats(allow_nan=True, allow_infinity=True),
         "bool": st.booleans(), "str": st.text(max_size=8), "list": st.lists(st.integers(-5, 5), max_size=3),
         "dict": st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2), "any": VALUES}


@st.composite
def columnar_records(draw):
    """Records whose keys each hold one type, as a results file's do, each value possibly null or
    absent: the native columns and the optional keys."""
    kinds = draw(st.dictionaries(KEYS, st.sampled_from(sorted(TYPED)), min_size=1, max_size=5))
    records = []
    for _ in range(draw(st.integers(0, 6))):
        r = {}
        for k, kind in kinds.items():
            how = draw(st.sampled_from(["value", "value", "null", "absent"]))
            if how != "absent":
                r[k] = draw(TYPED[kind]) if how == "value" else None
        records.append(r)
    return records


RECORDS = st.one_of(columnar_records(), st.lists(st.dictionaries(KEYS, VALUES, max_size=5), max_size=6))


@settings(max_examples=300, deadline=None)
@given(records=RECORDS)
@example(records=[{"a": None}, {}, {"a": 1}])  # absent in one record, null in another
@example(records=[{"a": None, "_present.a": True}, {}])  # a key named as the presence column would be
@example(records=[{"a": 1}, {"a": 1.0}, {"a": True}])  # one column, three types
@example(records=[{"a": 2**63}, {"a": -2**70}])  # beyond int64
@example(records=[{"a": math.nan}, {"a": -math.inf}, {"a": [math.inf, {"x": math.nan}]}])
@example(records=[{}, {}])  # no keys at all: only the number of records
def test_any_records_come_back_as_they_went_in(records):
    table = records_to_table(records)
    back = table_to_records(table, "table")
    assert len(back) == len(records) and all(same(a, b) for a, b in zip(back, records)), (back, records)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=RECORDS)
def test_any_records_come_back_from_a_file(tmp_path, records):
    write_records(tmp_path / "r.parquet", records)
    back = read_records(tmp_path / "r.parquet")
    assert len(back) == len(records) and all(same(a, b) for a, b in zip(back, records))
    assert not (tmp_path / "r.parquet.tmp").exists()


def test_records_that_are_not_objects_with_string_keys_are_refused(tmp_path):
    for records in ([{"a": 1}, 3], [{"a": 1}, {1: "x"}], ["expr"], [None]):
        with pytest.raises(ValueError):
            records_to_table(records)
        with pytest.raises(ValueError):
            write_records(tmp_path / "r.parquet", records)
        assert not (tmp_path / "r.parquet").exists()


# --- results and traces ---------------------------------------------------------------------------

def test_results_round_trip_with_traces_kept_apart(tmp_path):
    results = [{"expr": f"add({i},{i})", "correct": i % 3 != 0, "bin": "0-0.25" if i < 4 else ">5.0",
                "diverge_at": None if i % 3 else 7, "reason": None if i % 3 else "wrong answer", "id": i}
               for i in range(8)]
    for i in (0, 3, 6):
        results[i]["trace"] = f"add ( {i} , {i} ) <call> trace {i}"
    summary = {"n": 8, "accuracy": 5 / 8, "learner": "rm"}
    res, summ = write_results(tmp_path, results, summary)
    assert (res, summ) == (tmp_path / "results.parquet", tmp_path / "summary.json")
    assert json.loads(summ.read_text()) == summary and results_file(tmp_path) == res and has_results(tmp_path)
    # The table of answers holds no trace; the traces, by row, only those kept.
    assert "trace" not in pq.read_schema(res).names
    assert read_records(tmp_path / "traces.parquet") == [{"row": i, "trace": results[i]["trace"]} for i in (0, 3, 6)]
    assert read_results(tmp_path) == results
    assert read_results(res) == results  # the file itself, as the folder
    assert read_results(tmp_path, traces=False) == [{k: v for k, v in r.items() if k != "trace"} for r in results]
    # Written again without traces: no traces file is left behind to be attached to other rows.
    bare = [{k: v for k, v in r.items() if k != "trace"} for r in results[:5]]
    write_results(tmp_path, bare, summary)
    assert not (tmp_path / "traces.parquet").exists() and read_results(tmp_path) == bare
    # A legacy results.jsonl is read the same, and replaced when the folder is written again.
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    assert results_file(legacy) == legacy / "results.jsonl" and read_results(legacy) == results
    write_results(legacy, results, summary)
    assert sorted(p.name for p in legacy.iterdir()) == ["results.parquet", "summary.json", "traces.parquet"]
    assert read_results(legacy) == results


def test_results_without_the_required_fields_or_with_stray_traces_are_one_line(tmp_path):
    write_results(tmp_path, [{"expr": "add(1,2)"}], {})
    with pytest.raises(DataError, match="record 1 is not a per-expression result") as e:
        read_results(tmp_path)
    assert "\n" not in str(e.value)
    assert read_results(tmp_path, required=("expr",)) == [{"expr": "add(1,2)"}]  # a probe's rows
    write_results(tmp_path, [{"expr": "add(1,2)", "correct": True}], {})
    for rows in ([{"row": 1, "trace": "x"}], [{"row": 0, "trace": 3}], [{"row": True, "trace": "x"}],
                 [{"row": 0, "trace": "x"}, {"row": 0, "trace": "y"}]):
        write_records(tmp_path / "traces.parquet", rows)
        with pytest.raises(DataError, match="traces.parquet: a trace row does not name one result"):
            read_results(tmp_path)
        assert read_results(tmp_path, traces=False) == [{"expr": "add(1,2)", "correct": True}]
    (tmp_path / "traces.parquet").unlink()
    (tmp_path / "results.parquet").unlink()
    with pytest.raises(DataError, match="no results.parquet or results.jsonl"):
        read_results(tmp_path)


# --- converting a committed folder -------------------------------------------------------------------

def _as_json_lines(folder: Path) -> None:
    """Rewrite whatever a folder holds as Parquet records in the JSON lines it was written in
    before (the committed folders are being converted; the test needs the form before)."""
    for res in sorted(folder.rglob("results.parquet")):
        records = read_results(res.parent, required=())
        (res.parent / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        res.unlink()
        (res.parent / "traces.parquet").unlink(missing_ok=True)
    for log in sorted(folder.rglob("metrics.parquet")):
        (log.parent / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in read_metrics(log.parent)))
        log.unlink()


def _record_folders(folder: Path) -> tuple[list[Path], list[Path]]:
    """(every evaluation and probe folder, every run folder with a training log) under `folder`."""
    results = sorted({p.parent for name in ("results.parquet", "results.jsonl") for p in folder.rglob(name)})
    runs = sorted({p.parent for name in ("metrics.parquet", "metrics.jsonl") for p in folder.rglob(name)})
    return results, runs


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A copy of a small committed folder in JSON lines (results.jsonl, metrics.jsonl), its
    records before conversion, and the copy converted by `rlmlab convert`."""
    legacy = tmp_path_factory.mktemp("legacy") / SMALL
    shutil.copytree(RESULTS / SMALL, legacy)
    _as_json_lines(legacy)
    evals, runs = _record_folders(legacy)
    before = {"results": {p.relative_to(legacy): read_results(p, required=()) for p in evals},
              "metrics": {p.relative_to(legacy): read_metrics(p) for p in runs}}
    converted = tmp_path_factory.mktemp("converted") / SMALL
    shutil.copytree(legacy, converted)
    assert main(["convert", str(converted)]) == 0
    return legacy, before, converted


def test_convert_keeps_every_record_of_a_committed_folder(small, capsys):
    legacy, before, converted = small
    evals, runs = _record_folders(converted)
    # Both evaluations and both probes, both training logs.
    assert len(before["results"]) == 4 and len(before["metrics"]) == 2
    assert [p.relative_to(converted) for p in evals] == sorted(before["results"])
    assert [p.relative_to(converted) for p in runs] == sorted(before["metrics"])
    for rel, records in before["results"].items():
        assert results_file(converted / rel).name == "results.parquet" and not (converted / rel / "results.jsonl").exists()
        assert read_results(converted / rel, required=()) == records, rel
        assert records and all("trace" not in r for r in read_results(converted / rel, required=(), traces=False))
    for rel, records in before["metrics"].items():
        assert metrics_file(converted / rel).name == "metrics.parquet" and read_metrics(converted / rel) == records != []
    # What is not a record file is as it was; commands.jsonl (the commands, not records) stays.
    others = sorted(p.relative_to(legacy) for p in legacy.rglob("*") if p.is_file()
                    and p.name not in ("results.jsonl", "metrics.jsonl"))
    assert others == sorted(p.relative_to(converted) for p in converted.rglob("*") if p.is_file()
                            and p.suffix != ".parquet")
    for rel in others:
        assert (converted / rel).read_bytes() == (legacy / rel).read_bytes(), rel
    # A second conversion finds nothing left to convert.
    capsys.readouterr()
    assert main(["convert", str(converted)]) == 0
    assert "0 result files and 0 training logs converted" in capsys.readouterr().out


def test_the_report_of_a_converted_folder_is_the_committed_report_byte_for_byte(small, tmp_path):
    _, _, converted = small
    copy = tmp_path / SMALL
    shutil.copytree(converted, copy)
    shutil.rmtree(copy / "report")
    assert main(["report", str(copy)]) == 0
    assert_report_regenerates(RESULTS / SMALL / "report", copy / "report", SMALL)
    figures = sorted(p.name for p in (RESULTS / SMALL / "report").iterdir() if p.suffix in (".png", ".pdf"))
    assert figures and figures == sorted(p.name for p in (copy / "report").iterdir() if p.suffix in (".png", ".pdf"))


def test_convert_reencodes_older_parquet_records_keeping_their_table(tmp_path, capsys):
    # Records written with pyarrow's default encoding (as rlmlab once wrote them) are rewritten
    # with today's: the same table, metadata included, in fewer bytes; a second pass has nothing to do.
    rng = random.Random(0)
    folder = tmp_path / "exp" / "job" / "rm" / "eval" / "eval"
    folder.mkdir(parents=True)
    records = [{"expr": f"add({rng.randrange(10)},{i % 7})", "correct": rng.random() < 0.5, "row": i,
                "trace": " ".join(str(rng.randrange(10)) for _ in range(rng.randrange(40, 80)))} for i in range(400)]
    write_rows(folder, records)
    old = {}
    for name in ("results.parquet", "traces.parquet"):
        table = pq.read_table(folder / name)
        pq.write_table(table, folder / name, compression="zstd")
        old[name] = (table, (folder / name).read_bytes())
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "exp")]) == 0
    assert "2 Parquet files re-encoded" in capsys.readouterr().out
    for name, (table, before) in old.items():
        after = (folder / name).read_bytes()
        assert after != before and len(after) < len(before), name
        assert pq.read_table(folder / name).equals(table, check_metadata=True), name
    assert read_results(folder, required=()) == records
    assert main(["convert", str(tmp_path / "exp")]) == 0
    assert "0 Parquet files re-encoded" in capsys.readouterr().out
    # A Parquet file rlmlab did not write is refused on one line and left as it is.
    pq.write_table(pa.table({"x": [1, 2]}), folder / "results.parquet")
    foreign = (folder / "results.parquet").read_bytes()
    assert "results.parquet" in one_line_error(capsys, ["convert", str(tmp_path / "exp")])
    assert (folder / "results.parquet").read_bytes() == foreign


def test_a_results_file_that_does_not_come_back_unchanged_is_left_as_it_is(tmp_path, capsys):
    # A null trace: kept apart, it would not name a trace; the file is refused and kept.
    folder = tmp_path / "exp" / "job" / "rm" / "eval" / "eval"
    folder.mkdir(parents=True)
    text = '{"expr": "add(1,2)", "correct": true, "trace": null}\n'
    (folder / "results.jsonl").write_text(text)
    err = one_line_error(capsys, ["convert", str(tmp_path / "exp")])
    assert "results.jsonl" in err
    assert sorted(p.name for p in folder.iterdir()) == ["results.jsonl"] and (folder / "results.jsonl").read_text() == text
    # A line that is not JSON: the same.
    (folder / "results.jsonl").write_text('{"expr": "add(1,2)", "correct": true}\n{"expr": oops\n')
    assert "line 2" in one_line_error(capsys, ["convert", str(tmp_path / "exp")])
    assert sorted(p.name for p in folder.iterdir()) == ["results.jsonl"]
    one_line_error(capsys, ["convert", str(tmp_path / "none")])


def test_export_converts_what_it_copies_and_leaves_the_destinations_own_files_alone(tmp_path):
    """The smoke fixture's JSON lines land as Parquet, record for record; JSON-lines files the
    destination held before (a user's notes, garbage) are not the export's to convert or drop."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "smoke-length"
    dest = tmp_path / "dest"
    dest.mkdir()
    own = {"results.jsonl": "garbage\n", "metrics.jsonl": "{}\n", "notes/results.jsonl": '{"expr": "x"}\n'}
    for rel, text in own.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    assert main(["export", str(fixture), str(dest)]) == 0
    assert {rel: (dest / rel).read_text() for rel in own} == own
    assert not (dest / "results.parquet").exists() and not (dest / "metrics.parquet").exists()
    for run in ("length-96/rm", "length-96/cot"):
        assert not (dest / run / "metrics.jsonl").exists() and not (dest / run / "eval/eval/results.jsonl").exists()
        assert read_metrics(dest / run) == read_metrics(fixture / run) != []
        assert read_results(dest / run / "eval/eval") == read_results(fixture / run / "eval/eval")


def test_export_never_overwrites_a_readme_the_destination_holds(tmp_path, capsys):
    """A results folder carried to another machine and back carries the README of its day; its
    re-export must not replace the destination's newer README (a person's only copy). A
    top-level file the destination lacks is copied; one it holds is kept, and named when the
    two differ; rlmlab's own experiment.json is still brought over."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "smoke-length"
    src = tmp_path / "src"
    shutil.copytree(fixture, src)
    (src / "README.md").write_text("old reading\n")
    (src / "NOTES.md").write_text("same notes\n")
    (src / "plan.txt").write_text("a plan\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "README.md").write_text("new reading, with this week's numbers\n")
    (dest / "NOTES.md").write_text("same notes\n")
    assert main(["export", str(src), str(dest)]) == 0
    err = capsys.readouterr().err
    assert (dest / "README.md").read_text() == "new reading, with this week's numbers\n"
    assert (dest / "NOTES.md").read_text() == "same notes\n" and (dest / "plan.txt").read_text() == "a plan\n"
    assert "kept its own README.md" in err and "NOTES.md" not in err
    assert json.loads((dest / "experiment.json").read_text())["kind"] == json.loads((src / "experiment.json").read_text())["kind"]
    assert (dest / "report").is_dir()
    # Into a fresh destination the source's README is copied like any file.
    assert main(["export", str(src), str(tmp_path / "fresh")]) == 0
    assert (tmp_path / "fresh" / "README.md").read_text() == "old reading\n"


def test_export_lands_parquet_records_in_todays_encoding(tmp_path):
    """A run whose records an older writer encoded is exported in today's encoding, so that
    exporting an unchanged run again leaves a committed folder's bytes as they were."""
    src = tmp_path / "exp"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "smoke-length", src)
    assert main(["convert", str(src)]) == 0
    older = {}
    for path in sorted(src.rglob("*.parquet")):
        if path.name in ("results.parquet", "traces.parquet", "metrics.parquet"):
            table = pq.read_table(path)
            pq.write_table(table, path, compression="zstd")  # pyarrow's defaults, as rlmlab once wrote
            older[path.relative_to(src)] = table
    assert len(older) >= 4
    assert main(["export", str(src), str(tmp_path / "dest")]) == 0
    for rel, table in older.items():
        landed = tmp_path / "dest" / rel
        assert pq.read_table(landed).equals(table, check_metadata=True), rel
        assert not reencode_records(landed), rel  # already today's encoding: nothing to rewrite


# --- malformed Parquet ---------------------------------------------------------------------------------

def _truncated(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _random_bytes(path: Path) -> None:
    path.write_bytes(random.Random(0).randbytes(path.stat().st_size))


def _foreign(path: Path) -> None:
    """A readable Parquet file that rlmlab did not write: no records metadata."""
    pq.write_table(pa.table({"expr": ["add(1,2)"], "correct": [True]}), path)


def _empty(path: Path) -> None:
    path.write_bytes(b"")


DAMAGE = {"truncated": (_truncated, "not a readable Parquet file"), "random bytes": (_random_bytes, "not a readable Parquet file"),
          "empty": (_empty, "not a readable Parquet file"),
          "foreign": (_foreign, "not a table of records written by rlmlab")}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("name", ["results.parquet", "traces.parquet"])
def test_a_damaged_results_parquet_is_one_line_from_the_reader_and_the_viewer(tmp_path, capsys, damage, name):
    damage_file, message = DAMAGE[damage]
    folder = tmp_path / "eval"
    write_results(folder, [{"expr": "square(2)", "correct": False, "trace": "square ( 2 )"},
                           {"expr": "add(1,2)", "correct": True}], {"n": 2})
    damage_file(folder / name)
    with pytest.raises(DataError, match=message) as e:
        read_results(folder)
    assert "\n" not in str(e.value) and name in str(e.value)
    err = one_line_error(capsys, ["view", str(folder), "--out", str(tmp_path / "view")])
    assert message in err and name in err
    assert not (tmp_path / "view").exists()


@pytest.fixture
def converted_copy(small, tmp_path):
    _, _, converted = small
    copy = tmp_path / SMALL
    shutil.copytree(converted, copy)
    return copy


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("rel", ["length-197/rm/eval/eval/results.parquet", "length-197/rm/probe/eval/results.parquet",
                                 "length-197/cot/metrics.parquet"])
def test_a_damaged_parquet_file_in_an_experiment_is_one_line_from_report_and_view(converted_copy, capsys, damage, rel):
    damage_file, message = DAMAGE[damage]
    damage_file(converted_copy / rel)
    report_before = {p.name: p.read_bytes() for p in (converted_copy / "report").iterdir()}
    err = one_line_error(capsys, ["report", str(converted_copy)])
    assert message in err and rel.split("/")[-1] in err
    assert {p.name: p.read_bytes() for p in (converted_copy / "report").iterdir()} == report_before
    if rel.endswith("results.parquet") and "/eval/" in rel and "/probe/" not in rel:
        err = one_line_error(capsys, ["view", str(converted_copy), "--out", str(converted_copy.parent / "view")])
        assert message in err


def test_a_damaged_training_log_is_one_line_from_its_reader(tmp_path):
    write_records(tmp_path / "metrics.parquet", [{"kind": "val", "step": 2, "answer_acc": 0.5}])
    assert has_metrics(tmp_path) and read_metrics(tmp_path) == [{"kind": "val", "step": 2, "answer_acc": 0.5}]
    for damage, (damage_file, message) in DAMAGE.items():
        write_records(tmp_path / "metrics.parquet", [{"kind": "val", "step": 2, "answer_acc": 0.5}])
        damage_file(tmp_path / "metrics.parquet")
        with pytest.raises(DataError, match=message) as e:
            read_metrics(tmp_path)
        assert "\n" not in str(e.value), damage


# --- readers check what a file claims before they trust it -----------------------------------

def _claimed(path: Path, table, **meta) -> None:
    """`table` written at `path` with rlmlab's records metadata (and `meta` in it)."""
    doc = {"format": "rlmlab-records/1", "optional": [], "json": [], "present": {}, **meta}
    pq.write_table(table.replace_schema_metadata({b"rlmlab.records": json.dumps(doc)}), path, compression="zstd")


HOSTILE_FILES = {
    # no columns, and metadata that claims 10^12 empty records: refused before they are made
    "rows in metadata": (lambda p: _claimed(p, pa.table({}), rows=10**12), "claims 1,000,000,000,000 rows"),
    # ten million nulls compress into a few kilobytes: more rows than any file of records holds
    "rows in footer": (lambda p: _claimed(p, pa.table({"a": pa.nulls(10**7)})), "claims 10,000,000 rows"),
    "nested column": (lambda p: _claimed(p, pa.table({"expr": [[1, 2]], "correct": [True]})), "column 'expr'"),
    "json column not text": (lambda p: _claimed(p, pa.table({"a": [1]}), json=["a"]), "column 'a'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_a_parquet_file_that_claims_what_rlmlab_never_writes_is_refused_before_reading(tmp_path, case):
    write, message = HOSTILE_FILES[case]
    write(tmp_path / "records.parquet")
    with pytest.raises(DataError, match=message) as e:
        read_records(tmp_path / "records.parquet")
    assert "\n" not in str(e.value) and "records.parquet" in str(e.value)


def _rewrite(path: Path, change) -> None:
    """Replace the records of `path` by `change(records)`."""
    write_records(path, change(read_records(path)))


def _val_acc(records: list[dict], value) -> list[dict]:
    return [{**r, "answer_acc": value} if r.get("kind") == "val" else r for r in records]


RUN = "length-197/cot"
BAD_RECORDS = {
    # a training log's step as text, an accuracy of +inf (which would mark CoT fitted)
    "step as text": (f"{RUN}/metrics.parquet", lambda rs: [{**r, "step": str(r["step"])} for r in rs],
                     "'step' should be a whole number"),
    "accuracy inf": (f"{RUN}/metrics.parquet", lambda rs: _val_acc(rs, math.inf), "'answer_acc' should be a finite"),
    "accuracy above 1": (f"{RUN}/metrics.parquet", lambda rs: _val_acc(rs, 1.5), "'answer_acc' should be a finite"),
    "empty log": (f"{RUN}/metrics.parquet", lambda rs: [], "metrics.parquet: no records"),
    # a results file without the column the table is computed from, or without any row
    "no bin": (f"{RUN}/eval/eval/results.parquet", lambda rs: [{k: v for k, v in r.items() if k != "bin"} for r in rs],
               "no 'bin' field"),
    "bin as number": (f"{RUN}/eval/eval/results.parquet", lambda rs: [{**r, "bin": 1} for r in rs],
                      "'bin' should be text"),
    "no results": (f"{RUN}/eval/eval/results.parquet", lambda rs: [], "results.parquet: no records"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_records_of_the_wrong_type_range_or_shape_are_one_line_from_report_view_and_load(tmp_path, capsys, case):
    """Typed, in range, with the columns a table needs and with rows: else one line naming the
    file and the field, never a blank cell, a learner marked fitted or a traceback."""
    from rlmlab.results import records

    rel, change, message = BAD_RECORDS[case]
    folder = tmp_path / SMALL
    shutil.copytree(RESULTS / SMALL, folder)
    _rewrite(folder / rel, change)
    err = one_line_error(capsys, ["report", str(folder)])
    assert message in err and rel.split("/")[-1] in err
    if case == "no bin":  # a table needs the bins; the records themselves and their pages do not
        return
    with pytest.raises(DataError, match=message):
        records(folder, "metrics" if "metrics" in rel else "eval")
    if "results" in rel:
        assert message in one_line_error(capsys, ["view", str(folder), "--out", str(tmp_path / "view")])
        assert not (tmp_path / "view").exists()

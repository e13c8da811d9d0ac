"""One copy of each run: an experiment folder holds a run that a folder beside it holds byte for
byte by reference (refs.json), and every reader follows the reference or refuses it."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import one_line_error

from rlmlab.cli import main
from rlmlab.errors import DataError
from rlmlab.experiments.convert import convert_folder
from rlmlab.experiments.refs import REFS, experiment_runs, read_refs, run_path
from rlmlab.experiments.report import report
from rlmlab.results import records

COMMITTED = Path(__file__).resolve().parent.parent / "results" / "length-197-small"


@pytest.fixture()
def twins(tmp_path):
    """Two experiment folders side by side in one results tree, the second converted so that it
    refers to the first's runs."""
    tree = tmp_path / "results"
    shutil.copytree(COMMITTED, tree / "a")
    shutil.copytree(COMMITTED, tree / "b")
    counts = convert_folder(tree / "b")
    return tree / "a", tree / "b", counts


def test_identical_runs_become_references_and_read_the_same(twins, tmp_path):
    a, b, counts = twins
    assert counts["referred"] == ["length-197/cot", "length-197/rm"]
    assert not (b / "length-197").exists()  # no second copy
    assert set(read_refs(b)) == {"length-197/cot", "length-197/rm"}
    assert run_path(b, "length-197", "rm").resolve() == (a / "length-197" / "rm").resolve()
    assert [(j, v) for j, v, _ in experiment_runs(b)] == [("length-197", "cot"), ("length-197", "rm")]
    assert records(b) == records(a)
    report(b, tmp_path / "rb")
    for f in sorted((a / "report").glob("*.md")) + [a / "report" / "report.json"]:
        assert (tmp_path / "rb" / f.name).read_bytes() == f.read_bytes(), f.name
    assert main(["view", str(b), "--out", str(tmp_path / "view"), "--limit", "3"]) == 0
    assert len(list((tmp_path / "view").rglob("*.html"))) == 3  # the index and one page per learner


def _edit_refs(b: Path, **entry) -> None:
    doc = json.loads((b / REFS).read_text())
    doc["runs"]["length-197/rm"].update(entry)
    (b / REFS).write_text(json.dumps(doc))


@pytest.mark.parametrize("damage, message", [
    (lambda a, b: (a / "length-197" / "rm" / "config.json").write_text("{}"), "digest differs"),
    (lambda a, b: shutil.rmtree(a / "length-197" / "rm"), "not a folder"),
    (lambda a, b: _edit_refs(b, path="../../.."), "not a run folder beside this one"),
    (lambda a, b: _edit_refs(b, path="/etc"), "not a run folder beside this one"),
    (lambda a, b: (b / REFS).write_text('{"format": "rlmlab-refs/1", "runs": []}'), "not a rlmlab-refs/1 file"),
    (lambda a, b: (b / REFS).write_text("{"), "not valid JSON"),
])
def test_a_bad_reference_is_one_line_and_nothing_is_read(twins, tmp_path, capsys, damage, message):
    a, b, _ = twins
    damage(a, b)
    with pytest.raises(DataError, match=message):
        report(b, tmp_path / "rb")
    for argv in (["report", str(b)], ["view", str(b), "--out", str(tmp_path / "v")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_different_run_is_kept_as_a_copy(tmp_path):
    tree = tmp_path / "results"
    shutil.copytree(COMMITTED, tree / "a")
    shutil.copytree(COMMITTED, tree / "b")
    (tree / "a" / "length-197" / "rm" / "done.json").write_text("{}")  # no longer the same run
    assert convert_folder(tree / "b")["referred"] == ["length-197/cot"]
    assert (tree / "b" / "length-197" / "rm").is_dir()


def _refer(b: Path, key: str, path: str, digest: str | None = None) -> None:
    """Add to b's refs.json the reference `key` -> `path` (with the digest of b's rm run)."""
    doc = json.loads((b / REFS).read_text())
    doc["runs"][key] = {"path": path, "digest": digest or doc["runs"]["length-197/rm"]["digest"]}
    (b / REFS).write_text(json.dumps(doc))


@pytest.mark.parametrize("key, path, message", [
    ("../rm", "../a/length-197/rm", "is not a run"),  # `view --out OUT` would write beside OUT
    ("./rm", "../a/length-197/rm", "is not a run"),
    ("../../../etc", "../a/length-197/rm", "is not a run"),
    ("report/rm", "../a/length-197/rm", "is not a run"),  # a folder the experiment keeps no runs in
    ("length-197/r\0m", "../a/length-197/rm", "is not a run"),
    ("length-197/" + "m" * 256, "../a/length-197/rm", "is not a run"),
    ("length-197/rm2", "../a/length-197/rm\0", "is not a run folder beside this one"),
    ("length-197/rm2", "../a/length-197/../../../..", "is not a run folder beside this one"),
    ("length-197/rm2", "../a/" + "x/" * 500_000 + "rm", "is not a run folder beside this one"),
    ("length-197/rm2", "../" + "a" * 1_000_000, "is not a run folder beside this one"),
    ("length-197/rm2", "a/length-197/rm", "is not a run folder beside this one"),
])
def test_a_reference_that_is_not_a_plain_name_is_refused_by_every_reader_and_writer(twins, tmp_path, capsys,
                                                                                    key, path, message):
    """Keys and paths of refs.json are checked as text, before the file system sees them: no
    `..`, no absolute path, no NUL, bounded length; one line and nothing written from `report`,
    `view`, `export`, `convert` and `rlmlab.results`."""
    a, b, _ = twins
    _refer(b, key, path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(DataError, match=message):
        records(b)
    for argv in (["report", str(b)], ["view", str(b), "--out", str(tmp_path / "v" / "out")],
                 ["export", str(b), str(tmp_path / "exported")], ["convert", str(b)]):
        err = one_line_error(capsys, argv)
        assert message in err and len(err) < 800, argv
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written anywhere

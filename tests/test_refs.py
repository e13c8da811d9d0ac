"""One copy of each run: an experiment folder holds a run that a folder beside it holds byte for
byte by reference (refs.json), and every reader follows the reference or refuses it."""

import json
import shutil
from pathlib import Path

import pytest

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
    (lambda a, b: _edit_refs(b, path="../../.."), "points outside"),
    (lambda a, b: _edit_refs(b, path="/etc"), "points outside"),
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

"""Where a run's evaluations lie: `<run>/eval/<set>/`, the set "eval" in `<run>/eval/` itself.
Folders written before kept that set in `<run>/eval/eval/`; the report, `rlmlab.results`, the
export and the viewer read either layout to the same numbers and pages."""

import json
import re
import shutil
from pathlib import Path

import pytest

import rlmlab.results
from rlmlab.cli import main
from rlmlab.experiments.report import report
from rlmlab.measuring.result_files import eval_dir, evaluated_sets, find_eval_dir, read_results, run_of_eval_dir

FIXTURE = Path(__file__).parent / "fixtures" / "smoke-length"  # written in the old layout
RUNS = ("length-96/rm", "length-96/cot")


@pytest.fixture
def both_layouts(tmp_path):
    """The fixture as committed (eval/eval/) and the same files in the current layout (eval/)."""
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(FIXTURE, old)
    shutil.copytree(FIXTURE, new)
    for run in RUNS:
        nested = new / run / "eval" / "eval"
        for f in nested.iterdir():
            f.rename(new / run / "eval" / f.name)
        nested.rmdir()
    return old, new


def test_the_set_eval_is_written_one_level_down_and_found_in_either_layout(both_layouts):
    old, new = both_layouts
    assert eval_dir("r", "eval") == Path("r/eval") and eval_dir("r", "test") == Path("r/eval/test")
    for run in RUNS:
        assert find_eval_dir(old / run, "eval") == old / run / "eval" / "eval"
        assert find_eval_dir(new / run, "eval") == new / run / "eval"
        assert evaluated_sets(old / run) == {"eval": old / run / "eval" / "eval"}
        assert evaluated_sets(new / run) == {"eval": new / run / "eval"}
        assert read_results(find_eval_dir(old / run, "eval")) == read_results(find_eval_dir(new / run, "eval"))
    assert find_eval_dir(new / "length-96" / "rm", "test") == new / "length-96" / "rm" / "eval" / "test"
    for base, folder in ((old, "eval/eval"), (new, "eval"), (new, "eval/test")):
        assert run_of_eval_dir(base / "length-96/rm" / folder) == base / "length-96/rm"


def test_report_and_records_read_both_layouts_alike(both_layouts, tmp_path):
    old, new = both_layouts
    reports = {name: report(folder, tmp_path / f"report-{name}") for name, folder in (("old", old), ("new", new))}
    files = sorted(p.name for p in reports["old"].iterdir())
    assert files == sorted(p.name for p in reports["new"].iterdir()) and "table-length-96.md" in files
    for name in files:
        assert (reports["old"] / name).read_bytes() == (reports["new"] / name).read_bytes(), name
    assert (reports["new"] / "table-length-96.md").read_bytes() == (FIXTURE / "report" / "table-length-96.md").read_bytes()
    rows = rlmlab.results.records(new)
    assert rows == rlmlab.results.records(old) and len(rows) == 80 and {r["set"] for r in rows} == {"eval"}


def test_export_keeps_and_the_viewer_reads_either_layout(both_layouts, tmp_path):
    old, new = both_layouts
    for name, folder in (("old", old), ("new", new)):
        dest = tmp_path / f"export-{name}"
        assert main(["export", str(folder), str(dest)]) == 0
        for run in RUNS:
            where = dest / run / "eval" / ("eval" if name == "old" else "")
            assert read_results(where) == read_results(find_eval_dir(folder / run, "eval"))
        assert main(["view", str(folder), "--out", str(tmp_path / f"view-{name}"), "--limit", "5", "--quiet"]) == 0
    pages = {}
    for name in ("old", "new"):
        index = (tmp_path / f"view-{name}" / "index.html").read_text()
        pages[name] = sorted(re.findall(r'<a href="([^"]+\.html)">', index))
    assert pages["old"] == pages["new"] == ["length-96/cot/eval.html", "length-96/rm/eval.html"]
    for link in pages["new"]:  # the same page, but for the evaluation folder it names
        run = link.rpartition("/")[0]
        page = {name: (tmp_path / f"view-{name}" / link).read_text() for name in ("old", "new")}
        assert page["old"].replace(str(old / run / "eval" / "eval"), "EVAL") == \
            page["new"].replace(str(new / run / "eval"), "EVAL")


def test_rlmlab_eval_writes_data_named_eval_one_level_down(tmp_path, monkeypatch, capsys):
    data = tmp_path / "eval.txt"
    data.write_text("add(1,2)\ndouble(3)\n")
    monkeypatch.chdir(tmp_path)  # the oracle's default --out is under runs/
    assert main(["eval", "--oracle", "rm", "--data", str(data), "--quiet"]) == 0
    oracle = tmp_path / "runs" / "oracle-rm"
    assert json.loads((oracle / "eval" / "summary.json").read_text())["n"] == 2
    assert not (oracle / "eval" / "eval").exists()

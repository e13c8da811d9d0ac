"""`rlmlab.results` in a notebook: every row carries `fitted`, by the rule the report withholds
out-of-domain cells by, so that an unfitted run's out-of-domain accuracy is not read as a result
(checked against the committed reports of folders that have an unfitted run); and without pandas,
`load` names an extra that installs it."""
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

import rlmlab.results
from rlmlab.errors import ConfigError
from rlmlab.experiments.seeds import seeded_job
from rlmlab.results import records

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def fitted_runs(rows: list[dict]) -> dict[tuple[str, str], bool]:
    """{(job, learner): fitted}, checking that each run's rows agree."""
    runs = {}
    for r in rows:
        assert runs.setdefault((r["job"], r["learner"]), r["fitted"]) is r["fitted"], (r["job"], r["learner"])
    return runs


def test_length_rows_say_which_runs_the_report_withholds():
    """Length split over seeds: a run is fitted exactly when the report counts its seed among
    the learner's fitted seeds (the NoPE CoT, 95.7% best validation, is not)."""
    folder = RESULTS / "length-595-paper-cpu-steps"
    report = json.loads((folder / "report" / "report.json").read_text())
    rows = records(folder)
    runs = fitted_runs(rows)
    expected = {(seeded_job(report["job"], s), v): s in d["fitted_seeds"]
                for v, d in report["seeds"]["learners"].items() for s in d["seeds"]}
    assert runs == expected
    assert not runs[("length-595", "cot@none")] and report["not_fitted"] == ["cot@none"]
    # What the report shows: out-of-domain rows of fitted runs only, in-domain rows of all.
    shown = [r for r in rows if r["fitted"] or not r["ood"]]
    assert {r["learner"] for r in rows if r["ood"]} - {r["learner"] for r in shown if r["ood"]} == {"cot@none"}


def test_training_logs_carry_the_same_mark():
    folder = RESULTS / "length-595-paper-cpu-steps"
    assert fitted_runs(records(folder, what="metrics")) == fitted_runs(records(folder))


def test_shortcut_rows_follow_table_3s_not_fitted_column():
    """Table 3 withholds by IID accuracy: the runs marked not fitted are the learners its
    "Not fitted" column names (the CoT on copy answer from deep return, 98.3% IID)."""
    folder = RESULTS / "shortcuts-paper-cpu-steps"
    text = (folder / "report" / "table-shortcuts.md").read_text()
    lines = text[text.index("|"):].split("\n\n")[0].splitlines()  # the file's first table
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    column = next(i for i, c in enumerate(header) if c.startswith("Not fitted"))
    labels = {"RM": "rm", "CoT": "cot"}
    named = set()
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        unfit = cells[column].split(";")[0]  # "CoT; no run: ..." names a missing run after the ";"
        if unfit != "–" and not unfit.startswith("no run"):
            named |= {(f"shortcut-{cells[0]}", labels[n.strip()]) for n in unfit.split(",")}
    runs = fitted_runs(records(folder))
    assert named == {("shortcut-copy_deep_return", "cot")}
    assert {run for run, ok in runs.items() if not ok} == named


def test_without_pandas_load_names_an_extra_that_installs_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    with pytest.raises(ConfigError, match="needs pandas") as error:
        rlmlab.results.load(RESULTS / "length-595-paper-cpu-steps")
    extra = re.search(r'pip install -e "\.\[(\w+)\]"', str(error.value)).group(1)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "pandas" in [re.split(r"[<>=!~; \[]", r)[0] for r in extras[extra]]

"""The result tables quoted in the READMEs are the generated ones, not retyped numbers.

`rlmlab report` writes every table under results/*/report/; the READMEs quote them next to the
paper's numbers. These tests fail when a quoted number differs from the committed report, so
a re-run that changes a figure cannot leave a stale or hand-edited copy behind.
"""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every pipe table in `text`: its rows (header first, separator dropped) as lists of cells."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        line = line.strip()
        if line.startswith("|") and line.endswith("|"):
            cells = [c.strip() for c in line[1:-1].split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def table_with_header(tables, first_cell: str) -> list[list[str]]:
    found = [t for t in tables if t[0][0] == first_cell]
    assert len(found) == 1, f"expected one table headed {first_cell!r}, found {len(found)}"
    return found[0]


def row(table, label: str) -> list[str]:
    found = [r[1:] for r in table if r[0] == label]
    assert len(found) == 1, f"expected one row {label!r}, found {len(found)}"
    return found[0]


def generated(folder: str, name: str) -> list[list[list[str]]]:
    return markdown_tables((RESULTS / folder / "report" / name).read_text())


MAIN = markdown_tables((ROOT / "README.md").read_text())


@pytest.mark.parametrize("folder, table, readme_header, readme_rows", [
    ("length-197-small", "table-length-197.md", "Length bin (×L)", {
        "RM, L=197, small (%)": "RM acc. (%)",
        "CoT, L=197, small, not fitted (%)": "CoT acc. (%), not fitted (best validation 96.0)",
        "CoT non-invariant points, probe (%)": "CoT non-invariant positions (%)"}),
    ("length-595-paper-cpu", "table-length-595.md", "Length bin (×L), L = 595", {
        "RM, L=595, paper-cpu (%)": "RM acc. (%)",
        "CoT, L=595, paper-cpu (%)": "CoT acc. (%)"}),
    ("depth-10-paper-cpu", "table-depth-10.md", "Depth bin (×K), K = 10", {
        "RM, K=10, paper-cpu (%)": "RM acc. (%)",
        "CoT, K=10, paper-cpu (%)": "CoT acc. (%)"}),
    ("depth-5-small", "table-depth-5.md", "Depth bin (×K)", {
        "RM, K=5, small (%)": "RM acc. (%)",
        "CoT, K=5, small, not fitted (%)": "CoT acc. (%), not fitted (best validation 80.3)"}),
])
def test_main_readme_bin_tables_match_reports(folder, table, readme_header, readme_rows):
    quoted = table_with_header(MAIN, readme_header)
    report = generated(folder, table)[0]
    for readme_label, report_label in readme_rows.items():
        assert row(quoted, readme_label) == row(report, report_label), readme_label


@pytest.mark.parametrize("folder, complete", [("shortcuts-small", True), ("shortcuts-paper-cpu", False)])
def test_main_readme_shortcut_tables_are_the_generated_ones(folder, complete):
    """The README quotes `table-shortcuts-paper.md` verbatim, and that table carries the report's
    own numbers: every construction the report has a row for (all six once the experiment is
    complete), each cell the one `table-shortcuts.md` gives, with its not-fitted mark."""
    from rlmlab.experiments.kinds.shortcuts import PAPER_NAMES

    side_by_side = generated(folder, "table-shortcuts-paper.md")[0]
    assert table_with_header(MAIN, side_by_side[0][0]) == side_by_side
    report = generated(folder, "table-shortcuts.md")[0]
    columns = report[0]

    def cell(construction, column):
        return row(report, construction)[columns.index(column) - 1]

    reported = {PAPER_NAMES[r[0]]: r[0] for r in report[1:] if any(c != "–" for c in r[1:5])}
    assert sorted(r[0] for r in side_by_side[1:]) == sorted(reported)
    if complete:
        assert sorted(reported) == sorted(PAPER_NAMES.values())
    for name, construction in reported.items():
        iid, ood, rate, probe, paper_iid, paper_ood, paper_rate, fit = row(side_by_side, name)
        assert iid == f"{cell(construction, 'IID RM acc.')} / {cell(construction, 'IID CoT acc.')}"
        assert ood == f"{cell(construction, 'OOD RM acc.')} / {cell(construction, 'OOD CoT acc.')}"
        assert rate == (f"{cell(construction, 'Shortcut rate (RM)')} / "
                        f"{cell(construction, 'Shortcut rate (CoT)')}")
        cot_probe = cell(construction, "Non-invariant positions IID / OOD, CoT (%)")
        assert probe == ("–" if cot_probe == "– / –" else cot_probe), name
        assert (f"{paper_iid} / {paper_ood} / {paper_rate}"
                == cell(construction, "paper (IID RM/CoT, OOD RM/CoT, rate)")), name
        assert fit == cell(construction, "Not fitted (IID < 99%)"), name


IID_FOLDERS = ("iid-small", "iid-paper-cpu")


def test_main_readme_quotes_each_iid_table_verbatim():
    quoted = [t for t in MAIN if t[0][0] == "N"]
    assert len(quoted) == len(IID_FOLDERS)
    for folder in IID_FOLDERS:
        assert table_with_header(generated(folder, "table-iid.md"), "N") in quoted, folder


def typography(cell: str) -> str:
    """A cell as the report writes it: the READMEs typeset <= as ≤, ranges with en dashes."""
    for fancy, plain in (("≤", "<="), ("≥", ">="), ("–", "-"), ("−", "-"), ("**", ""), (" (IID)", "")):
        cell = cell.replace(fancy, plain)
    return cell


@pytest.mark.parametrize("folder", sorted(p.name for p in RESULTS.iterdir() if (p / "report").is_dir()))
def test_results_readme_tables_equal_the_generated_ones(folder):
    """Each table in results/X/README.md is a generated table: verbatim where it has the same
    header, and row for row (by row label, up to typography) where only its typesetting differs."""
    reports = [t for f in sorted((RESULTS / folder / "report").glob("*.md"))
               for t in markdown_tables(f.read_text())]
    quoted = markdown_tables((RESULTS / folder / "README.md").read_text())
    checked_rows = 0
    for table in quoted:
        verbatim = [t for t in reports if t[0] == table[0]]
        if verbatim:
            assert table in verbatim, f"{folder}/README.md: table headed {table[0][:3]} differs from the report"
            checked_rows += len(table) - 1
            continue
        header = [typography(c) for c in table[0][1:]]
        retypeset = [t for t in reports if [typography(c) for c in t[0][1:]] == header]
        assert retypeset, f"{folder}/README.md: table headed {table[0][:3]} is not a generated table"
        for label, *cells in table[1:]:
            matches = [r[1:] for t in retypeset for r in t[1:] if r[0] == label]
            if matches:
                assert [typography(c) for c in cells] == [typography(c) for c in matches[0]], (folder, label)
                checked_rows += 1
    assert checked_rows, f"{folder}/README.md quotes none of its generated tables"

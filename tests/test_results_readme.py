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


def unfenced(text: str) -> str:
    """`text` without its fenced code blocks: a table printed by a command (the demo's, in the
    README) is output to compare by eye, not a quoted report table."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


# The documents that quote report tables: the README gives the headline tables, the results
# index the rest. A table may move between them; each check below looks in both.
QUOTING = {name: markdown_tables(unfenced((ROOT / name).read_text()))
           for name in ("README.md", "results/README.md")}


def quotes(first_cell: str) -> list[tuple[str, list[list[str]]]]:
    return [(doc, t) for doc, tables in QUOTING.items() for t in tables if t[0][0] == first_cell]


# Per-bin tables: each quoted row, by its label, is a row of a generated table (the paper's
# rows included: the report prints them beside its own).
BIN_ROWS = {
    "RM, L=197, small (%)": ("length-197-small", "table-length-197.md", "RM acc. (%)"),
    "CoT, L=197, small, not fitted (%)": ("length-197-small", "table-length-197.md",
                                          "CoT acc. (%), not fitted (best validation 96.0)"),
    "CoT non-invariant points, probe, not fitted (%)": ("length-197-small", "table-length-197.md",
                                                        "CoT, not fitted, non-invariant positions (%)"),
    "RM, L=595, paper-cpu (%)": ("length-595-paper-cpu", "table-length-595.md", "RM acc. (%)"),
    "CoT, L=595, paper-cpu (%)": ("length-595-paper-cpu", "table-length-595.md", "CoT acc. (%)"),
    "RM, paper, L=595 (%)": ("length-595-paper-cpu", "table-length-595.md", "paper RM (%)"),
    "CoT, paper, L=595 (%)": ("length-595-paper-cpu", "table-length-595.md", "paper CoT (%)"),
    # Over training seeds (the report's second table of the file), then seed 0's rows.
    "RM, L=595, paper-cpu, steps, mean over seeds (%)": ("length-595-paper-cpu-steps", "table-length-595.md",
                                                         "RM: mean over seeds (%)"),
    "CoT, L=595, paper-cpu, steps, mean over seeds (%)": ("length-595-paper-cpu-steps", "table-length-595.md",
                                                          "CoT: mean over seeds (%)"),
    "RM, 95% interval, seeds and expressions": ("length-595-paper-cpu-steps", "table-length-595.md", "RM: 95% interval"),
    "RM, per seed (%)": ("length-595-paper-cpu-steps", "table-length-595.md", "RM: per seed (%)"),
    "CoT, 95% interval, seeds and expressions": ("length-595-paper-cpu-steps", "table-length-595.md",
                                                  "CoT: 95% interval"),
    "CoT, per seed (%)": ("length-595-paper-cpu-steps", "table-length-595.md", "CoT: per seed (%)"),
    "CoT (NoPE), L=595, paper-cpu, steps, not fitted (%)": (
        "length-595-paper-cpu-steps", "table-length-595.md",
        "CoT (NoPE), seed 0, acc. (%), not fitted (best validation 95.7)"),
    "CoT (RoPE), L=595, paper-cpu, steps, mean over seeds (%)": ("length-595-paper-cpu-steps", "table-length-595.md",
                                                                 "CoT (RoPE): mean over seeds (%)"),
    "RM (RoPE), L=595, paper-cpu, steps, mean over seeds (%)": ("length-595-paper-cpu-steps", "table-length-595.md",
                                                                "RM (RoPE): mean over seeds (%)"),
    "RM, K=10, paper-cpu, steps, mean over seeds (%)": ("depth-10-paper-cpu-steps", "table-depth-10.md",
                                                        "RM: mean over seeds (%)"),
    "RM, K=10, 95% interval, seeds and expressions": ("depth-10-paper-cpu-steps", "table-depth-10.md",
                                                      "RM: 95% interval"),
    "RM, K=10, per seed (%)": ("depth-10-paper-cpu-steps", "table-depth-10.md", "RM: per seed (%)"),
    "CoT, K=10, paper-cpu, steps, mean over seeds (%)": ("depth-10-paper-cpu-steps", "table-depth-10.md",
                                                         "CoT: mean over seeds (%)"),
    "CoT, K=10, per seed (%)": ("depth-10-paper-cpu-steps", "table-depth-10.md", "CoT: per seed (%)"),
    "CoT (NoPE), K=10, paper-cpu, steps, not fitted (%)": (
        "depth-10-paper-cpu-steps", "table-depth-10.md", "CoT (NoPE), seed 0, acc. (%), not fitted (best validation 96.3)"),
    "CoT (RoPE), K=10, paper-cpu, steps (%)": ("depth-10-paper-cpu-steps", "table-depth-10.md",
                                               "CoT (RoPE), seed 0, acc. (%)"),
    "RM, K=10, paper-cpu (%)": ("depth-10-paper-cpu", "table-depth-10.md", "RM acc. (%)"),
    "CoT, K=10, paper-cpu (%)": ("depth-10-paper-cpu", "table-depth-10.md", "CoT acc. (%)"),
    "RM, paper, K=10 (%)": ("depth-10-paper-cpu", "table-depth-10.md", "paper RM (%)"),
    "CoT, paper, K=10 (%)": ("depth-10-paper-cpu", "table-depth-10.md", "paper CoT (%)"),
    "RM, K=5, small (%)": ("depth-5-small", "table-depth-5.md", "RM acc. (%)"),
    "CoT, K=5, small, not fitted (%)": ("depth-5-small", "table-depth-5.md",
                                        "CoT acc. (%), not fitted (best validation 80.3)"),
}
BIN_HEADERS = ("Length bin (×L)", "Length bin (×L), L = 595", "Depth bin (×K)", "Depth bin (×K), K = 10")
# Both paper-cpu folders (wall-clock and step budgets) generate the same header: a quote is checked
# against the folder's table it projects, and each folder's table is quoted whole somewhere.
SHORTCUT_HEADERS = {"Construction, small": ("shortcuts-small",),
                    "Construction, paper-cpu": ("shortcuts-paper-cpu", "shortcuts-paper-cpu-steps")}
IID_FOLDERS = ("iid-small", "iid-paper-cpu")
# Table 3 with one row per learner, where learners beyond RM and CoT ran (`table-shortcuts-learners.md`).
LEARNER_HEADERS = {"Construction, by learner": "shortcuts-paper-cpu"}
IID_SUMMARY = ("training expressions N", "iid-paper-cpu-steps")  # the README's compact IID table
# Tables that quote no report: the results index and the README's preset table.
OTHER_HEADERS = ("folder", "preset")


def test_every_quoted_table_is_checked():
    """A table moved, renamed or added in the README or the results index must be checked here."""
    known = set(BIN_HEADERS) | set(SHORTCUT_HEADERS) | set(LEARNER_HEADERS) | {"N", IID_SUMMARY[0]} | set(OTHER_HEADERS)
    for doc, tables in QUOTING.items():
        for table in tables:
            assert table[0][0] in known, f"{doc}: table headed {table[0][0]!r} is checked by no test"


def test_readme_quotes_the_headline_tables():
    """The README opens with Table 2 at the paper's thresholds (the step-budgeted runs), Table 3
    and the IID sweep."""
    firsts = [t[0][0] for t in QUOTING["README.md"]]
    for header in ("Length bin (×L), L = 595", "Depth bin (×K), K = 10", "Construction, paper-cpu",
                   IID_SUMMARY[0]):
        assert header in firsts, header
    length = next(t for t in QUOTING["README.md"] if t[0][0] == "Length bin (×L), L = 595")
    assert [r[0] for r in length[1:3]] == ["RM, L=595, paper-cpu, steps, mean over seeds (%)",
                                           "CoT, L=595, paper-cpu, steps, mean over seeds (%)"]
    depth = next(t for t in QUOTING["README.md"] if t[0][0] == "Depth bin (×K), K = 10")
    assert [r[0] for r in depth[1:3]] == ["RM, K=10, paper-cpu, steps, mean over seeds (%)",
                                          "CoT, K=10, paper-cpu, steps, mean over seeds (%)"]


@pytest.mark.parametrize("header", BIN_HEADERS)
def test_quoted_bin_tables_match_reports(header):
    found = quotes(header)
    assert found, f"no document quotes the table headed {header!r}"
    for doc, quoted in found:
        for label, *cells in quoted[1:]:
            assert label in BIN_ROWS, f"{doc}: row {label!r} of {header!r} is not a known report row"
            folder, name, report_label = BIN_ROWS[label]
            # the file's table that holds the row: Table 2, or the one over training seeds
            report = next((t for t in generated(folder, name) if any(r[0] == report_label for r in t)),
                          generated(folder, name)[0])
            assert cells == row(report, report_label), (doc, label)
            assert ([typography(c) for c in quoted[0][1:]]
                    == [typography(c) for c in report[0][1:]]), (doc, header, folder)


def test_every_bin_row_is_quoted_somewhere():
    quoted = {r[0] for h in BIN_HEADERS for _, t in quotes(h) for r in t[1:]}
    assert sorted(set(BIN_ROWS) - quoted) == []


def assert_projection(quoted, full, where):
    """`quoted` keeps some columns of `full` (in order, the first among them) and some of its
    rows, each cell as `full` has it."""
    columns = [full[0].index(c) if c in full[0] else None for c in quoted[0]]
    assert None not in columns and columns[0] == 0 and columns == sorted(columns), (where, quoted[0])
    projected = [[r[i] for i in columns] for r in full[1:]]
    for r in quoted[1:]:
        assert r in projected, (where, r)
    assert len({r[0] for r in quoted[1:]}) == len(quoted) - 1, where


def is_projection(quoted, full) -> bool:
    try:
        assert_projection(quoted, full, "")
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("header, folder", sorted((h, f) for h, fs in SHORTCUT_HEADERS.items() for f in fs))
def test_quoted_shortcut_tables_are_the_generated_ones(header, folder):
    """One document quotes the folder's `table-shortcuts-paper.md` whole."""
    side_by_side = generated(folder, "table-shortcuts-paper.md")[0]
    assert any(t == side_by_side for _, t in quotes(header)), f"no document quotes {folder}'s Table 3 whole"


@pytest.mark.parametrize("header", sorted(SHORTCUT_HEADERS))
def test_every_shortcut_quote_projects_a_generated_table(header):
    """Every quote of a `table-shortcuts-paper.md` keeps the columns and rows of one of the
    header's folders' tables as generated."""
    tables = [generated(f, "table-shortcuts-paper.md")[0] for f in SHORTCUT_HEADERS[header]]
    found = quotes(header)
    assert found, f"no document quotes a table headed {header!r}"
    for doc, quoted in found:
        assert any(is_projection(quoted, t) for t in tables), (doc, quoted[0], quoted[1:])


@pytest.mark.parametrize("header, folder", sorted(LEARNER_HEADERS.items()))
def test_quoted_per_learner_shortcut_tables_are_the_generated_ones(header, folder):
    """Table 3 per learner is quoted whole, every row as generated, in each document that quotes it."""
    generated_table = generated(folder, "table-shortcuts-learners.md")[0]
    found = quotes(header)
    assert found, f"no document quotes {folder}'s per-learner Table 3"
    for doc, quoted in found:
        assert quoted == generated_table, doc


@pytest.mark.parametrize("folder, complete", [("shortcuts-small", True), ("shortcuts-paper-cpu", False),
                                              ("shortcuts-paper-cpu-steps", False)])
def test_side_by_side_shortcut_table_carries_the_report(folder, complete):
    """`table-shortcuts-paper.md` carries the report's own numbers: every construction the report
    has a row for (all six once the experiment is complete), each cell the one
    `table-shortcuts.md` gives, with its not-fitted mark."""
    from rlmlab.experiments.kinds.shortcuts import PAPER_NAMES

    side_by_side = generated(folder, "table-shortcuts-paper.md")[0]
    report = generated(folder, "table-shortcuts.md")[0]
    columns = report[0]

    def cell(construction, column):
        return row(report, construction)[columns.index(column) - 1]

    # a variant outside the paper's six (hidden_literal_late) keeps its own name, as the table does
    reported = {PAPER_NAMES.get(r[0], r[0]): r[0] for r in report[1:] if any(c != "–" for c in r[1:5])}
    assert sorted(r[0] for r in side_by_side[1:]) == sorted(reported)
    if complete:
        assert sorted(reported) == sorted(PAPER_NAMES.values())
    for name, construction in reported.items():
        iid, ood, rate, probe, paper_iid, paper_ood, paper_rate, fit = row(side_by_side, name)
        assert iid == f"{cell(construction, 'IID RM acc.')} / {cell(construction, 'IID CoT acc.')}"
        assert ood == f"{cell(construction, 'OOD RM acc.')} / {cell(construction, 'OOD CoT acc.')}"
        assert rate == (f"{cell(construction, 'Shortcut rate (RM)')} / "
                        f"{cell(construction, 'Shortcut rate (CoT)')}")
        probe_column = "Non-invariant positions IID / OOD, CoT (%)"  # absent where no run was probed
        cot_probe = cell(construction, probe_column) if probe_column in columns else "– / –"
        assert probe == ("–" if cot_probe == "– / –" else cot_probe), name
        paper = cell(construction, "paper (IID RM/CoT, OOD RM/CoT, rate)")  # "–" off the paper's six
        assert f"{paper_iid} / {paper_ood} / {paper_rate}" == ("– / – / – / – / –" if paper == "–" else paper), name
        assert fit == cell(construction, "Not fitted (IID < 99%)"), name


def test_each_iid_table_is_quoted_verbatim():
    quoted = [t for _, t in quotes("N")]
    assert len(quoted) == len(IID_FOLDERS)
    for folder in IID_FOLDERS:
        assert table_with_header(generated(folder, "table-iid.md"), "N") in quoted, folder


def test_readme_iid_summary_is_the_generated_table():
    """The README's IID table puts the sizes across: each cell is the final-answer accuracy the
    generated table gives that size and learner."""
    header, folder = IID_SUMMARY
    iid = table_with_header(generated(folder, "table-iid.md"), "N")
    accuracy = {(r[0], r[1]): r[iid[0].index("final answer (%)")] for r in iid[1:]}
    found = quotes(header)
    assert len(found) == 1
    summary = found[0][1]
    sizes = summary[0][1:]
    assert sorted(sizes, key=int) == sorted({n for n, _ in accuracy}, key=int)
    assert [r[0] for r in summary[1:]] == ["RM final answer (%)", "CoT final answer (%)"]
    for label, *cells in summary[1:]:
        learner = label.split()[0]
        assert cells == [accuracy[(n, learner)] for n in sizes], label


def typography(cell: str) -> str:
    """A cell as the report writes it: the READMEs typeset <= as ≤, ranges with en dashes."""
    for fancy, plain in (("≤", "<="), ("≥", ">="), ("–", "-"), ("−", "-"), ("**", ""), (" (IID)", "")):
        cell = cell.replace(fancy, plain)
    return cell


@pytest.mark.parametrize("folder", sorted(p.name for p in RESULTS.iterdir() if (p / "report").is_dir()))
def test_results_readme_tables_equal_the_generated_ones(folder):
    """Each table in results/X/README.md is a generated table: verbatim where it has the same
    header, and row for row (by row label, up to typography) where only its typesetting differs.
    A sweep's plan, printed by `rlmlab run sweep --plan` before its runs, is stored as plan.md."""
    sources = sorted((RESULTS / folder / "report").glob("*.md")) + sorted((RESULTS / folder).glob("plan.md"))
    reports = [t for f in sources for t in markdown_tables(f.read_text())]
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


def demo_output() -> list[str]:
    """The lines of docs/cli.md's fenced block that shows `rlmlab demo`'s output."""
    text = (ROOT / "docs" / "cli.md").read_text()
    start = text.index("```text\n$ rlmlab demo\n")
    return text[start:text.index("\n```", start + 1)].splitlines()[2:]


def test_documented_demo_output_is_the_committed_run_cut_to_its_bins():
    """The demo evaluates the released checkpoints, those of results/length-595-paper-cpu-steps
    (tests/test_demo.py), on the first N expressions of each bin of the same split, so the table
    docs/cli.md shows is the committed per-expression results cut to N per bin."""
    from rlmlab.measuring.result_files import read_results

    shown = markdown_tables("\n".join(demo_output()))[0]
    report = generated("length-595-paper-cpu-steps", "table-length-595.md")[0]
    assert shown[0] == report[0]
    bins = [c.removesuffix(" (IID)") for c in report[0][1:]]
    n = {int(c) for c in row(shown, "n")}
    assert len(n) == 1
    per_bin = n.pop()
    acc = {}
    for learner, name in (("rm", "RM"), ("cot", "CoT")):
        results = read_results(RESULTS / "length-595-paper-cpu-steps" / "length-595" / learner / "eval" / "eval")
        acc[name] = [100 * sum(r["correct"] for r in [r for r in results if r["bin"] == b][:per_bin]) / per_bin
                     for b in bins]
        assert row(shown, f"{name} acc. (%)") == [f"{a:.1f}" for a in acc[name]], name
    assert row(shown, "Gap (pt)") == [f"{a - b:+.1f}" for a, b in zip(acc["RM"], acc["CoT"])]
    for label in ("paper RM (%)", "paper CoT (%)"):
        assert row(shown, label) == row(report, label)


def test_readme_preset_table_gives_the_presets_step_budgets():
    """The README's preset table gives each learner's step budget as the preset sets it."""
    from rlmlab.experiments.presets import get_preset, settings_for

    def steps(cell):
        return [int(c.replace(",", "")) for c in cell.split(" / ")]

    found = [t for doc, t in quotes("preset") if doc == "README.md"]
    assert len(found) == 1
    table, name, checked = found[0], None, 0
    columns = table[0]
    for r in table[1:]:
        name = r[0].strip("`") or name
        preset = get_preset(name)
        experiment = r[columns.index("experiment")]
        for learner, column in (("rm", "RM steps"), ("cot", "CoT steps")):
            given = steps(r[columns.index(column)])
            if name == "smoke":
                expected = [preset.max_steps]
            elif experiment.startswith("length"):
                expected = [settings_for(preset.per_learner, learner)["train.max_steps"]]
            elif experiment.startswith("shortcuts"):
                expected = [settings_for(preset.shortcut_per_learner, learner)["train.max_steps"]]
            elif experiment.startswith("iid, per run, from N = "):  # the sizes from which a band's budget holds
                sizes = steps(experiment.removeprefix("iid, per run, from N = "))
                expected = [settings_for(preset.iid_per_size[n], learner)["train.max_steps"] for n in sizes]
                given = given * len(sizes) if len(given) == 1 else given
            else:
                assert experiment.startswith("iid"), experiment
                expected = [settings_for(preset.iid_per_learner, learner)["train.max_steps"]]
            assert given == expected, (name, experiment, learner)
            checked += 1
    assert checked >= 14

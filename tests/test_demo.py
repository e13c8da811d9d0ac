"""`rlmlab demo` on the released checkpoints: the runs are taken as finished and only evaluated."""

import json

from rlmlab.cli import main


def test_demo_evaluates_the_released_checkpoints_without_training(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--per-bin", "1", "--quiet"]) == 0
    table = capsys.readouterr().out
    for view in ("rm", "cot"):
        run = out / "length-595" / view
        assert json.loads((run / "done.json").read_text())["stop_reason"] == "released"
        assert not (run / "last").exists()  # nothing was trained
        assert len((run / "eval" / "eval" / "results.jsonl").read_text().splitlines()) == 10  # one per bin
    # Both released learners fitted their training distribution (99.7% validation accuracy), so
    # every bin of both rows holds a number.
    rows = {line.split(" | ")[0]: line.split(" | ")[1:] for line in table.splitlines() if "acc. (%)" in line}
    assert set(rows) == {"| RM acc. (%)", "| CoT acc. (%)"}
    assert all(len(cells) == 10 and "not fitted" not in " ".join(cells) for cells in rows.values())

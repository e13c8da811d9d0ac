"""`rlmlab demo` on the released checkpoints: the runs are taken as finished and only evaluated."""

import json

from rlmlab.cli import main


def test_demo_evaluates_the_released_checkpoints_without_training(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--per-bin", "1", "--quiet"]) == 0
    table = capsys.readouterr().out
    for view in ("rm", "cot"):
        run = out / "length-197" / view
        assert json.loads((run / "done.json").read_text())["stop_reason"] == "released"
        assert not (run / "last").exists()  # nothing was trained
        assert len((run / "eval" / "eval" / "results.jsonl").read_text().splitlines()) == 10  # one per bin
    # The released CoT stopped at 96.0% validation accuracy: below the plateau, so not fitted.
    assert "| RM acc. (%) |" in table and "CoT acc. (%), not fitted (best validation 96.0)" in table

"""`rlmlab demo` on the released checkpoints: the runs are taken as finished and only evaluated."""

import json
from pathlib import Path

import pytest

from rlmlab.cli import main
from rlmlab.measuring.result_files import read_results

COMMITTED = Path(__file__).resolve().parent.parent / "results" / "length-595-paper-cpu-steps" / "length-595"


# About 170 s on a 2-core CPU (the 500k pool is rebuilt): kept out of CI, run with
# `pytest -m slow`; the released checkpoints' predictions are checked in tests/test_reproduce.py.
@pytest.mark.slow
def test_demo_evaluates_the_released_checkpoints_without_training(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--per-bin", "1", "--quiet"]) == 0
    table = capsys.readouterr().out
    for learner in ("rm", "cot"):
        run = out / "length-595" / learner
        assert json.loads((run / "done.json").read_text())["stop_reason"] == "released"
        assert not (run / "last").exists()  # nothing was trained
        results = read_results(run / "eval")
        assert len(results) == 10  # one per bin
        # The released checkpoints are the committed run's: on the first expression of each bin
        # they give the committed prediction and first divergence (docs/cli.md's demo table is
        # the committed results cut to 40 per bin, tests/test_results_readme.py).
        committed = read_results(COMMITTED / learner / "eval" / "eval")
        first = {}
        for r in committed:
            first.setdefault(r["bin"], r)
        for r in results:
            expected = first[r["bin"]]
            assert (r["expr"], r["prediction"], r["diverge_at"]) == (
                expected["expr"], expected["prediction"], expected["diverge_at"]), (learner, r["bin"])
    # Both released learners fitted their training distribution (RM 99.7%, CoT 100.0% validation
    # accuracy), so every bin of both rows holds a number.
    rows = {line.split(" | ")[0]: line.split(" | ")[1:] for line in table.splitlines() if "acc. (%)" in line}
    assert set(rows) == {"| RM acc. (%)", "| CoT acc. (%)"}
    assert all(len(cells) == 10 and "not fitted" not in " ".join(cells) for cells in rows.values())


def test_the_demo_takes_the_cores_the_load_leaves_idle():
    from rlmlab.cli.demo_cmd import idle_cores

    assert [idle_cores(2, load) for load in (0.0, 0.4, 0.6, 1.0, 1.6, 2.0, 7.5)] == [2, 2, 1, 1, 1, 1, 1]
    assert idle_cores(16, 3.2) == 13 and idle_cores(4, None) == 4 and idle_cores(2, -1.0) == 2


def test_the_demo_refuses_a_thread_count_before_writing(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err and not out.exists()

"""Tables as pure functions of saved results, on hand-made results folders."""

import json

from rlmlab.report import iid_points, threshold_tables
from rlmlab.score import wilson


def _write_results(path, correct: list[bool], tf_correct: list[int] | None = None):
    path.mkdir(parents=True)
    with open(path / "results.jsonl", "w") as f:
        for i, ok in enumerate(correct):
            r = {"expr": f"add({i % 10},{i // 10 % 10})", "correct": ok}
            if tf_correct is not None:
                r |= {"tf_correct": tf_correct[i], "tf_total": 10}
            f.write(json.dumps(r) + "\n")


def test_iid_seeds_are_averaged_and_not_counted_as_independent_samples(tmp_path):
    right = [i < 25 for i in range(50)]
    # N = 100 has only seed 1 (seed 0 was never run): it is found, with Wilson's interval.
    _write_results(tmp_path / "iid-N100-s1" / "rm" / "eval" / "test", right, [10] * 50)
    # N = 200: two seeds tested on the same 50 expressions, perfectly correlated.
    for seed in (0, 1):
        _write_results(tmp_path / f"iid-N200-s{seed}" / "rm" / "eval" / "test", right, [9] * 50)
    p100, p200 = iid_points(tmp_path, [100, 200])
    assert (p100["N"], p100["seeds"], p100["accuracy"]) == (100, 1, 0.5)
    assert p100["ci95"] == list(wilson(25, 50))
    assert (p200["seeds"], p200["accuracy"], p200["per_token"]) == (2, 0.5, 0.9)
    # Two copies of the same 50 outcomes carry the information of 50, not of 100 samples.
    pooled = wilson(50, 100)
    width = p200["ci95"][1] - p200["ci95"][0]
    assert width > 1.2 * (pooled[1] - pooled[0])
    assert abs(width - (wilson(25, 50)[1] - wilson(25, 50)[0])) < 0.06


def test_paper_rows_only_for_the_learners_the_paper_has():
    views = ["rm", "cot", "rm-frames"]
    cell = {"n": 1, "correct": 1, "accuracy": 1.0, "ci95": [0.2, 1.0]}
    rows = [{"bin": f"b{i}", "ood": i >= 3, "available": 1, **{v: cell for v in views}} for i in range(10)]
    md, tex = threshold_tables("length", 595, rows, views)
    papers = [line.split(" |")[0] for line in md.splitlines() if line.startswith("| paper")]
    assert papers == ["| paper RM (%)", "| paper CoT (%)"]
    assert "| rm-frames acc. (%) |" in md and "rm-frames" in tex

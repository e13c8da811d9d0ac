"""Statistics without model code: ROC AUC against its pairwise definition, its bootstrap interval."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmlab.measuring.stats import auc_with_interval, roc_auc


def pairwise_auc(scores, positive):
    """The definition: over every (positive, negative) pair, 1 if the positive scores higher, 1/2 on a tie."""
    pos = [s for s, p in zip(scores, positive) if p]
    neg = [s for s, p in zip(scores, positive) if not p]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=2, max_size=40)
       .filter(lambda xs: 0 < sum(p for _, p in xs) < len(xs)))
def test_roc_auc_is_the_pairwise_win_rate_with_ties_counting_half(items):
    scores = [s / 3 for s, _ in items]  # few distinct values: many ties
    positive = [p for _, p in items]
    assert roc_auc(scores, positive) == pytest.approx(pairwise_auc(scores, positive), abs=1e-12)


def test_roc_auc_extremes_and_one_class():
    assert roc_auc([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == 1.0
    assert roc_auc([0.1, 0.2, 0.8, 0.9], [True, True, False, False]) == 0.0
    assert roc_auc([0.5] * 4, [True, False, True, False]) == 0.5
    assert roc_auc([0.1, 0.2], [True, True]) is None
    with pytest.raises(ValueError):
        roc_auc([0.1, float("nan")], [True, False])


def test_auc_interval_covers_the_estimate_and_narrows_with_data():
    rng = np.random.default_rng(0)

    def sample(n):
        wrong = rng.random(n) < 0.5
        scores = rng.normal(size=n) + wrong  # failures score higher on average: AUC about 0.76
        return scores, wrong

    small, large = auc_with_interval(*sample(60)), auc_with_interval(*sample(2000))
    for a in (small, large):
        lo, hi = a["ci95"]
        assert lo <= a["auc"] <= hi
    assert 0.72 < large["auc"] < 0.80 and large["ci95"][0] > 0.5
    assert large["ci95"][1] - large["ci95"][0] < (small["ci95"][1] - small["ci95"][0]) / 3
    assert auc_with_interval([1.0, 2.0], [True, True]) == {"auc": None, "ci95": None, "n_positive": 2,
                                                            "n_negative": 0}
    # Deterministic for a given seed: a report regenerates byte for byte.
    s, w = sample(80)
    assert auc_with_interval(s, w) == auc_with_interval(s, w)

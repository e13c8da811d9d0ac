"""How much of a cell is the seed: per-bin statistics over a learner's training seeds, and
paired differences between learners. Pure NumPy over saved results.

Every seed of a cell is scored on the same expressions, so a cell is a 0/1 matrix, seeds by
expressions. Its interval comes from a two-level bootstrap that resamples the seeds and the
expressions, each with replacement, and takes the mean of the resampled matrix: it is wide
when the seeds disagree and when the expressions are few. With one seed it reduces to a
bootstrap over expressions. A difference between two learners resamples the same expressions
for both (the pairing) and each learner's own seeds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

N_BOOT = 2000
BOOT_SEED = 0  # fixed, so that a report regenerates byte for byte
LEVEL = 0.95


def correctness(per_seed: Sequence[Sequence[dict]], where: str) -> np.ndarray:
    """The seeds × expressions 0/1 matrix of one learner's results in one bin; every seed must
    hold the same expressions in the same order (ValueError otherwise)."""
    exprs = [r["expr"] for r in per_seed[0]]
    for res in per_seed[1:]:
        if [r["expr"] for r in res] != exprs:
            raise ValueError(f"{where}: the seeds were not scored on the same expressions")
    return np.asarray([[bool(r["correct"]) for r in res] for res in per_seed], dtype=np.float64)


CHUNK = 100  # bootstrap draws resampled at once: 100 x 3 seeds x 5,000 expressions of float64 is 12 MB


def _resampled_sums(m: np.ndarray, seed_idx: np.ndarray, expr_idx: np.ndarray) -> np.ndarray:
    """Sum of m[seeds, expressions] per bootstrap draw (rows of the index arrays)."""
    return np.concatenate([m[seed_idx[i:i + CHUNK, :, None], expr_idx[i:i + CHUNK, None, :]].sum(axis=(1, 2))
                           for i in range(0, len(seed_idx), CHUNK)])


def _resampled_means(m: np.ndarray, seed_idx: np.ndarray, expr_idx: np.ndarray) -> np.ndarray:
    """Mean of m[seeds, expressions] per bootstrap draw (rows of the index arrays)."""
    return _resampled_sums(m, seed_idx, expr_idx) / (seed_idx.shape[1] * expr_idx.shape[1])


def _draws(rng: np.random.Generator, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.integers(0, k, size=(N_BOOT, k)), rng.integers(0, n, size=(N_BOOT, n))


def _interval(stats: np.ndarray) -> list[float]:
    a = (1 - LEVEL) / 2
    return [float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))]


def cell(m: np.ndarray) -> dict:
    """Mean over seeds and expressions of a seeds × expressions matrix, each seed's accuracy,
    their range and the two-level bootstrap interval."""
    k, n = m.shape
    per_seed = m.mean(axis=1)
    rng = np.random.default_rng(BOOT_SEED)
    s, e = _draws(rng, k, n)
    return {"seeds": k, "n": n, "mean": float(m.mean()), "per_seed": [float(x) for x in per_seed],
            "min": float(per_seed.min()), "max": float(per_seed.max()), "ci95": _interval(_resampled_means(m, s, e))}


def ratio_cell(c: np.ndarray, t: np.ndarray) -> dict:
    """sum(c) / sum(t) of two seeds × expressions matrices (per-token hits and targets), each
    seed's own ratio, and the two-level bootstrap interval of the ratio."""
    k, n = c.shape
    rng = np.random.default_rng(BOOT_SEED)
    s, e = _draws(rng, k, n)
    per_seed = c.sum(axis=1) / np.maximum(t.sum(axis=1), 1)
    ratios = _resampled_sums(c, s, e) / np.maximum(_resampled_sums(t, s, e), 1)
    return {"seeds": k, "n": n, "mean": float(c.sum() / max(t.sum(), 1)), "per_seed": [float(x) for x in per_seed],
            "ci95": _interval(ratios)}


def paired(a: np.ndarray, b: np.ndarray) -> dict:
    """Mean of `a` minus mean of `b` (seeds × the same expressions each), with an interval that
    resamples the expressions once for both and each learner's seeds on their own."""
    if a.shape[1] != b.shape[1]:
        raise ValueError("paired learners must be scored on the same expressions")
    n = a.shape[1]
    rng = np.random.default_rng(BOOT_SEED)
    e = rng.integers(0, n, size=(N_BOOT, n))
    sa = rng.integers(0, a.shape[0], size=(N_BOOT, a.shape[0]))
    sb = rng.integers(0, b.shape[0], size=(N_BOOT, b.shape[0]))
    diff = _resampled_means(a, sa, e) - _resampled_means(b, sb, e)
    lo, hi = _interval(diff)
    return {"diff": float(a.mean() - b.mean()), "ci95": [lo, hi], "seeds": [a.shape[0], b.shape[0]], "n": n,
            "verdict": "higher" if lo > 0 else "lower" if hi < 0 else "not separated"}

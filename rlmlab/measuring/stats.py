"""Statistics of per-expression results: shares with Wilson intervals, bootstrap intervals,
ROC AUC, and how much of a cell is the seed. Pure NumPy, so that tables and reports never
import model code.

Every function takes the result dicts that `rlmlab.measuring.score.expression_results` builds (or plain
numbers) and returns JSON-safe values.

Over training seeds (`correctness`, `seed_cell`, `seed_ratio_cell`, `paired`): every seed of a
cell is scored on the same expressions, so a cell is a 0/1 matrix, seeds by expressions. Its
interval comes from a two-level bootstrap that resamples the seeds and the expressions, each
with replacement, and takes the mean of the resampled matrix: it is wide when the seeds
disagree and when the expressions are few. With one seed it reduces to a bootstrap over
expressions. A difference between two learners resamples the same expressions for both (the
pairing) and each learner's own seeds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (n = 0 gives (0, 1))."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # The bounds at k = 0 and k = n are exactly 0 and 1; say so rather than 1 - 1e-16.
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], n_boot: int = 2000, level: float = 0.95,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile interval of sum(num)/sum(den) when whole samples (expressions) are resampled
    with replacement: tokens of one expression stay together."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = len(num)
    if n == 0 or den.sum() == 0:
        return 0.0, 1.0
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    chunk = max(1, 2_000_000 // n)  # resample in blocks to bound memory
    for s in range(0, n_boot, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_boot - s), n))
        d = den[idx].sum(1)
        stats[s:s + len(idx)] = np.divide(num[idx].sum(1), d, out=np.zeros(len(idx)), where=d > 0)
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))


def accuracy(results: Sequence[dict]) -> dict:
    return share(sum(bool(r["correct"]) for r in results), len(results))


def share(k: int, n: int) -> dict:
    """k of n with its 95% Wilson interval, as `accuracy()` reports it."""
    lo, hi = wilson(k, n)
    return {"n": n, "correct": k, "accuracy": k / n if n else 0.0, "ci95": [lo, hi]}


def summarize(results: Sequence[dict], n_boot: int = 2000) -> dict:
    """Headline numbers of a results list (all recomputable from the list alone)."""
    s = accuracy(results)
    n = len(results)
    s["valid"] = sum(bool(r["valid"]) for r in results) / n if n else 0.0
    s["trace_exact"] = sum(bool(r["trace_exact"]) for r in results) / n if n else 0.0
    s["generated_tokens"] = sum(r["generated"] for r in results)
    if n and "tf_total" in results[0]:
        c = [r["tf_correct"] for r in results]
        t = [r["tf_total"] for r in results]
        s["per_token"] = sum(c) / sum(t) if sum(t) else 0.0
        s["per_token_ci95"] = list(bootstrap_ratio(c, t, n_boot))
        s["per_token_positions"] = sum(t)
    s["invalid_reasons"] = dict(Counter(r["reason"] for r in results if not r["valid"]).most_common())
    return s


def group_accuracy(results: Sequence[dict], key: str | Callable[[dict], object]) -> list[dict]:
    """Final-answer accuracy with Wilson intervals per group; `key` a result field or a function.
    Groups come out sorted by key."""
    fn = key if callable(key) else (lambda r: r[key])
    groups: dict[object, list[dict]] = {}
    for r in results:
        groups.setdefault(fn(r), []).append(r)
    return [{"group": g, **accuracy(rs)} for g, rs in sorted(groups.items(), key=lambda kv: _sort_key(kv[0]))]


def _sort_key(v):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def roc_auc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """Area under the ROC curve of `scores` for telling `positive` items from the others: the
    probability that a random positive scores above a random negative, ties counting half (the
    Mann-Whitney statistic). None when either class is empty."""
    s = np.asarray(scores, dtype=np.float64)
    pos = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    if not np.isfinite(s).all():
        raise ValueError("roc_auc: scores must be finite")
    ranks = _average_ranks(s)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _average_ranks(s: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    order = np.argsort(s, kind="stable")
    sorted_s = s[order]
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    mean_rank = (starts + ends + 1) / 2  # ranks starts+1 .. ends, averaged
    ranks = np.empty(len(s))
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def auc_with_interval(scores: Sequence[float], positive: Sequence[bool], n_boot: int = 2000, level: float = 0.95,
                      seed: int = 0) -> dict:
    """`roc_auc` with a percentile bootstrap interval over items, resampled within each class so
    that every replicate has both (a stratified bootstrap; the class sizes are fixed by the data).
    Returns {"auc", "ci95", "n_positive", "n_negative"}; auc and ci95 are None without both classes."""
    s = np.asarray(scores, dtype=np.float64)
    pos = np.asarray(positive, dtype=bool)
    out = {"auc": roc_auc(s, pos), "ci95": None, "n_positive": int(pos.sum()), "n_negative": int((~pos).sum())}
    if out["auc"] is None:
        return out
    rng = np.random.default_rng(seed)
    s_pos, s_neg = s[pos], s[~pos]
    flags = np.r_[np.ones(len(s_pos), bool), np.zeros(len(s_neg), bool)]
    reps = np.empty(n_boot)
    for b in range(n_boot):
        both = np.r_[s_pos[rng.integers(0, len(s_pos), len(s_pos))], s_neg[rng.integers(0, len(s_neg), len(s_neg))]]
        reps[b] = roc_auc(both, flags)
    a = (1 - level) / 2
    out["ci95"] = [float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a))]
    return out


# --- over training seeds (see the module docstring) ------------------------------------------

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


def seed_cell(m: np.ndarray) -> dict:
    """Mean over seeds and expressions of a seeds × expressions matrix, each seed's accuracy,
    their range and the two-level bootstrap interval."""
    k, n = m.shape
    per_seed = m.mean(axis=1)
    rng = np.random.default_rng(BOOT_SEED)
    s, e = _draws(rng, k, n)
    return {"seeds": k, "n": n, "mean": float(m.mean()), "per_seed": [float(x) for x in per_seed],
            "min": float(per_seed.min()), "max": float(per_seed.max()), "ci95": _interval(_resampled_means(m, s, e))}


def seed_ratio_cell(c: np.ndarray, t: np.ndarray) -> dict:
    """sum(c) / sum(t) of two seeds × expressions matrices (per-token hits and targets), each
    seed's own ratio, and the two-level bootstrap interval of the ratio."""
    k, n = c.shape
    rng = np.random.default_rng(BOOT_SEED)
    s, e = _draws(rng, k, n)
    per_seed = c.sum(axis=1) / np.maximum(t.sum(axis=1), 1)
    ratios = _resampled_sums(c, s, e) / np.maximum(_resampled_sums(t, s, e), 1)
    return {"seeds": k, "n": n, "mean": float(c.sum() / max(t.sum(), 1)), "per_seed": [float(x) for x in per_seed],
            "ci95": _interval(ratios)}


def one_run_interval(c: np.ndarray, t: np.ndarray | None = None) -> list[float]:
    """95% interval of where one training run lands, from a seeds × expressions matrix `c` of
    0/1 results (or of the ratio sum(c) / sum(t), for per-token hits `c` and targets `t`): each
    bootstrap draw takes one seed and resamples the expressions. `seed_cell`'s interval is that
    of the mean over seeds, which an outlying seed can lie outside; this one holds every seed's
    own value as long as there are fewer than 20 seeds (each seed carries 1/k of the draws,
    about half of them at or beyond its own value, more than the 2.5% each tail leaves)."""
    k, n = c.shape
    rng = np.random.default_rng(BOOT_SEED)
    s, e = rng.integers(0, k, size=(N_BOOT, 1)), rng.integers(0, n, size=(N_BOOT, n))
    if t is None:
        return _interval(_resampled_means(c, s, e))
    return _interval(_resampled_sums(c, s, e) / np.maximum(_resampled_sums(t, s, e), 1))


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

"""The shortcut rate (follow_S): how often a learner's answer equals the planted signal S, for
RM and CoT alike, with the accuracy beside it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rlmlab.errors import DataError


def _pred(r: Mapping, key: str):
    p = r[key]
    return p.strip() if isinstance(p, str) else p


def shortcut_rate(results: Iterable[Mapping], *, prediction_key: str = "prediction",
                  signal_key: str = "signal") -> float:
    """follow_S: the share of (OOD) results whose final answer equals S(x).

    `results` are per-expression mappings with the model's final answer under `prediction_key`
    (a token string; None or "" when no answer was produced, which never follows S) and S
    under `signal_key`. Applies to RM and CoT alike."""
    results = list(results)
    if not results:
        raise DataError("shortcut rate of no results is undefined")
    try:
        follows = sum(_pred(r, prediction_key) not in (None, "") and _pred(r, prediction_key) == r[signal_key]
                      for r in results)
    except KeyError as e:
        raise DataError(f"result lacks the key {e.args[0]!r}") from None
    return follows / len(results)


def shortcut_summary(results: Iterable[Mapping], *, prediction_key: str = "prediction",
                     signal_key: str = "signal", answer_key: str = "value") -> dict:
    """n, accuracy (prediction == answer) and shortcut rate of one evaluation set."""
    results = list(results)
    rate = shortcut_rate(results, prediction_key=prediction_key, signal_key=signal_key)
    try:
        correct = sum(_pred(r, prediction_key) == r[answer_key] for r in results)
    except KeyError as e:
        raise DataError(f"result lacks the key {e.args[0]!r}") from None
    return {"n": len(results), "accuracy": correct / len(results), "shortcut_rate": rate}

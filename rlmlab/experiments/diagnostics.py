"""What a threshold report adds beside its Table 2 (`rlmlab.experiments.kinds.threshold`): the
figure of accuracy per bin, how the wrong out-of-domain answers fail, whether the invariance
probe predicts which expressions fail, and the teacher-forced errors per active frame. Each is
a pure function of saved results; none of them changes a cell of the table."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlmlab.errors import DataError
from rlmlab.experiments.refs import run_path
from rlmlab.experiments.tables import learner_label, learner_line, pct, save_figures, saved_list, unfit_label
from rlmlab.measuring.frame_errors import render_frames
from rlmlab.measuring.result_files import has_results, read_results
from rlmlab.measuring.stats import auc_with_interval


def frame_width_section(rows: list[dict], t_max: int | None) -> str:
    """Markdown section comparing RM's accuracy on all out-of-domain expressions of a bin with
    its accuracy on those whose widest frame is within `t_max` (the widest active frame on the
    training side); empty without RM's out-of-domain cells or a recorded `t_max`."""
    diag = []
    for r in rows:
        if r["ood"] and r.get("rm") and r.get("rm_within_tmax"):
            diag.append(f"| {r['bin']} | {pct(r['rm']['accuracy'])} (n={r['rm']['n']}) | "
                        f"{pct(r['rm_within_tmax']['accuracy'])} (n={r['rm_within_tmax']['n']}) |")
    if not diag or t_max is None:
        return ""
    return (f"\nFrame-width diagnostic: T_max = {t_max} (widest active frame on the training side); "
            "RM accuracy on all OOD expressions of a bin vs those whose widest frame is within T_max:\n\n"
            "| bin | RM, all | RM, w_max ≤ T_max |\n|---|---|---|\n" + "\n".join(diag) + "\n")


FRAME_TABLE_FUNCTIONS = 12  # the most frequent functions out of domain, in `rlmlab frames` tables


def frame_error_sections(out: Path, job: str, learners: list[str], fits: dict[str, float | None]) -> str:
    """Markdown sections with `rlmlab frames`' table of each learner whose evaluation set was
    scored frame by frame (`<learner>/frames/eval/`); empty when none was. A learner that did
    not fit keeps its table, labelled: its out-of-domain columns are a diagnostic, not a result."""
    md = ""
    for v in learners:
        rows = saved_list(out, job, v, "frames", "eval", "rows")
        if not rows:
            continue
        try:
            table = render_frames(rows, top=FRAME_TABLE_FUNCTIONS)
        except (KeyError, TypeError):
            raise DataError(f"{run_path(out, job, v) / 'frames' / 'eval' / 'summary.json'}: malformed rows") from None
        md += (f"\nTeacher-forced errors per active-frame example, {learner_label(v)}{unfit_label(fits.get(v))} "
               "(`rlmlab frames`; an "
               "example is wrong if any of its targets is mispredicted; seen: the frame's call occurs among "
               "the frames of the training traces):\n\n" + table + "\n")
    return md


def plot_bins(path: Path, kind: str, threshold: int, rows: list[dict], learners: list[str],
              unfit: frozenset = frozenset(), spread: dict | None = None) -> None:
    """Accuracy per bin with Wilson bands; a learner in `unfit` is drawn in domain only. A learner
    with several seeds in `spread` (`seed_spread`) is drawn as its mean over seeds with the
    seeds-and-expressions band, each seed a faint line beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = list(range(len(rows)))
    for v in learners:
        multi = spread["learners"].get(v) if spread is not None else None
        if multi is not None and len(multi["seeds"]) > 1:
            _plot_seeds(ax, xs, v, multi)
            continue
        pts = [(x, r[v]) for x, r in zip(xs, rows) if r.get(v) and not (r["ood"] and v in unfit)]
        if not pts:
            continue
        x = [p[0] for p in pts]
        a = [100 * p[1]["accuracy"] for p in pts]
        lo = [100 * p[1]["ci95"][0] for p in pts]
        hi = [100 * p[1]["ci95"][1] for p in pts]
        label = learner_label(v) + (" (not fitted: in domain only)" if v in unfit else "")
        color, style = learner_line(v)
        line, = ax.plot(x, a, "o", linestyle=style, color=color, label=label)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2)
    n_iid = sum(not r["ood"] for r in rows)
    ax.axvline(n_iid - 0.5, color="gray", ls="--", lw=1)
    ax.set_xticks(xs, [r["bin"] for r in rows], rotation=30)
    ax.set_xlabel(f"bin (multiple of {'L' if kind == 'length' else 'K'}={threshold})")
    ax.set_ylabel("final-answer accuracy (%)")
    ax.set_ylim(-2, 102)
    unit = "L" if kind == "length" else "K"
    if spread is None:
        ax.legend()
        ax.set_title(f"{kind} split, {unit}={threshold}: accuracy per bin (95% Wilson)")
    else:  # the seeds' lines run along the top right, where the default legend would sit
        ax.legend(loc="center", bbox_to_anchor=(0.62, 0.42), fontsize=8)
        ax.set_title(f"{kind} split, {unit}={threshold}: accuracy per bin (faint lines: seeds; bands: 95%)")
    fig.tight_layout()
    save_figures(fig, path)


def _plot_seeds(ax, xs: list[int], v: str, d: dict) -> None:
    color, style = learner_line(v)
    pts = [(x, c) for x, c in zip(xs, d["cells"]) if c is not None and c["mean"] is not None]
    x = [p[0] for p in pts]
    line, = ax.plot(x, [100 * c["mean"] for _, c in pts], "o", linestyle=style, color=color, lw=2.2,
                    label=f"{learner_label(v)}, mean of {len(d['seeds'])} seeds")
    ax.fill_between(x, [100 * c["ci95"][0] for _, c in pts], [100 * c["ci95"][1] for _, c in pts],
                    color=line.get_color(), alpha=0.15)
    for s in map(str, d["seeds"]):
        seed_pts = [(xx, c["per_seed"].get(s)) for xx, c in zip(xs, d["cells"])
                    if c is not None and c["per_seed"].get(s) is not None]
        if seed_pts:
            ax.plot([p[0] for p in seed_pts], [100 * p[1] for p in seed_pts], linestyle=style,
                    color=line.get_color(), lw=0.8, alpha=0.35)


def wrong_trace_summary(results: list[dict]) -> dict | None:
    """How a learner's wrong out-of-domain answers fail: how many, the share of malformed traces
    (no answer at all), and where the produced trace first leaves the canonical one (token index
    of `diverge_at`: median and quartiles, linear interpolation). None without wrong answers."""
    wrong = [r for r in results if r.get("ood") and not r["correct"]]
    if not wrong:
        return None
    at = np.asarray([r["diverge_at"] for r in wrong if r.get("diverge_at") is not None], dtype=float)
    q1, median, q3 = (float(x) for x in np.percentile(at, [25, 50, 75])) if len(at) else (None,) * 3
    return {"n": len(wrong), "malformed": sum(not r["valid"] for r in wrong) / len(wrong),
            "diverge_median": median, "diverge_q1": q1, "diverge_q3": q3}


def wrong_trace_table(summaries: dict[str, dict], threshold_name: str) -> str:
    """Markdown section of `wrong_trace_summary` per fitted learner; empty when there are none."""
    if not summaries:
        return ""

    def tok(x: float | None) -> str:
        return "–" if x is None else f"{x:,.0f}" if x == int(x) else f"{x:,.1f}"

    md = ["| learner | wrong OOD answers | malformed (%) | first divergence, median token | quartiles |",
          "|---|---|---|---|---|"]
    md += [f"| {learner_label(v)} | {w['n']} | {pct(w['malformed'])} | {tok(w['diverge_median'])} | "
           f"{tok(w['diverge_q1'])} / {tok(w['diverge_q3'])} |" for v, w in summaries.items()]
    return (f"\nHow the wrong out-of-domain answers fail ({threshold_name}; learners that fit only): "
            "the share of traces that end without an answer, and the token at which the produced trace "
            "first leaves the canonical one:\n\n" + "\n".join(md) + "\n")


def probe_rows(out: Path, job: str, name: str, set_name: str) -> list[dict] | None:
    """`rlmlab probe`'s per-expression rows of a learner's evaluation set, if it was probed."""
    path = run_path(out, job, name) / "probe" / set_name
    return read_results(path, required=("expr", "positions", "position_differ")) if has_results(path) else None


def failure_predictors(results: list[dict], probe_rows: list[dict]) -> dict | None:
    """How well, expression by expression, the probe's non-invariance rate (non-invariant
    prediction points over points probed, measured teacher-forced on the canonical trace)
    tells the out-of-domain expressions a learner answers wrongly from those it answers
    rightly: ROC AUC with a stratified bootstrap interval. Trace length, which drives both,
    is the baseline a useful signal must beat. None when no probed OOD expression has points
    or a learner's non-invariance is zero throughout (RM's, by construction)."""
    key = "id" if all("id" in r for r in results) and all("id" in r for r in probe_rows) else "expr"
    answered = {r[key]: r["correct"] for r in results}
    scored = [(r["position_differ"] / r["positions"], r["trace_len"], not answered[r[key]])
              for r in probe_rows if r.get("ood") and r.get("positions") and r[key] in answered]
    if not scored or not any(s[0] for s in scored):
        return None
    rate, length, wrong = zip(*scored)
    return {"n": len(scored), "wrong": sum(wrong), "non_invariance": auc_with_interval(rate, wrong),
            "trace_len": auc_with_interval(length, wrong)}


def failure_prediction_table(predictors: dict[str, dict]) -> str:
    """Markdown section of `failure_predictors` per learner; empty when there are none."""
    if not predictors:
        return ""

    def auc(a: dict) -> str:
        if a["auc"] is None:
            return "– (one class only)"
        return f"{a['auc']:.2f} [{a['ci95'][0]:.2f}, {a['ci95'][1]:.2f}]"

    md = ["| learner | probed OOD expressions | answered wrongly | AUC, non-invariant positions | "
          "AUC, trace length |", "|---|---|---|---|---|"]
    md += [f"| {learner_label(v)} | {p['n']} | {p['wrong']} | {auc(p['non_invariance'])} | {auc(p['trace_len'])} |"
           for v, p in predictors.items()]
    return ("\nDoes non-invariance predict which out-of-domain expressions fail? ROC AUC over the probed OOD "
            "expressions (0.5: no better than chance; 95% stratified bootstrap interval); the share of "
            "non-invariant positions of an expression against its trace length as the predictor:\n\n"
            + "\n".join(md) + "\n")

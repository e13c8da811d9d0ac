"""The length and depth splits (the paper's Table 2): one job per learner on the split below a
threshold, tested per multiplier bin above and below it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlmlab.errors import DataError, NoResultsError
from rlmlab.experiments.folder import check_split, ensure_data, load_pool, write_meta
from rlmlab.experiments.job import Job
from rlmlab.experiments.kinds.base import ExperimentKind
from rlmlab.experiments.presets import ExperimentPreset
from rlmlab.experiments.seeds import check_seeds, seed_indices, seed_value, seeded_job
from rlmlab.experiments.tables import (
    FIT_THRESHOLD,
    eval_results,
    fitted,
    gap,
    learner_line,
    learner_name,
    learners,
    pct,
    plot_learning_curves,
    probe_groups,
    save_figure,
    saved_list,
    training_runs,
    training_summary,
)
from rlmlab.measuring.frame_errors import render_frames
from rlmlab.measuring.results import has_results, read_results
from rlmlab.measuring.stats import accuracy, auc_with_interval

# The paper's Table 2 (representative splits L=595, K=10), for side-by-side reading.
PAPER_TABLE2 = {
    ("length", 595): {"rm": [100.0, 100.0, 99.6, 99.3, 99.3, 99.6, 98.6, 95.7, 92.4, 76.4],
                      "cot": [100.0, 100.0, 99.6, 79.0, 24.5, 14.2, 10.6, 6.2, 10.1, 9.7]},
    ("depth", 10): {"rm": [100.0, 99.7, 99.6, 100.0, 99.6, 98.6, 98.4, 99.4, 98.6, 98.7],
                    "cot": [100.0, 100.0, 99.3, 68.6, 71.6, 67.9, 63.1, 52.2, 48.2, 38.4]},
}


FRAME_TABLE_FUNCTIONS = 12  # the most frequent functions out of domain, in `rlmlab frames` tables


def _frame_errors(out: Path, job: str, learners: list[str], fits: dict[str, float | None]) -> str:
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
            raise DataError(f"{out / job / v / 'frames' / 'eval' / 'summary.json'}: malformed rows") from None
        md += (f"\nTeacher-forced errors per active-frame example, {learner_name(v)}{_unfit_label(fits.get(v))} "
               "(`rlmlab frames`; an "
               "example is wrong if any of its targets is mispredicted; seen: the frame's call occurs among "
               "the frames of the training traces):\n\n" + table + "\n")
    return md


def _unfit_label(best: float | None) -> str:
    """The label a learner's out-of-domain diagnostics carry when it did not fit; empty if it did."""
    return "" if fitted(best) else f", not fitted (best validation {pct(best)})"


def threshold_rows(meta: dict, results: dict[str, list[dict] | None],
                   probes: dict[str, list[dict] | None] | None = None) -> list[dict]:
    """One dict per bin: label, IID/OOD, and per learner n, accuracy and Wilson interval, plus
    the learner's probe figures for the bin (`<learner>_probe`) where it was probed."""
    by_bin = {v: {g["group"]: g for g in groups if g.get("group_by") == "bin"}
              for v, groups in (probes or {}).items() if groups}
    rows = []
    for b in meta["split"]["bins"]:
        row = {"bin": b["label"], "ood": b["ood"], "available": b["available"]}
        for name, res in results.items():
            if res is None:
                continue
            in_bin = [r for r in res if r.get("bin") == b["label"]]
            row[name] = accuracy(in_bin) if in_bin else None
            within = [r for r in in_bin if r.get("within_tmax")]
            row[f"{name}_within_tmax"] = accuracy(within) if within else None
        for name, groups in by_bin.items():
            row[f"{name}_probe"] = groups.get(b["label"])
        rows.append(row)
    return rows


def threshold_tables(kind: str, threshold: int, rows: list[dict], learners: list[str],
                     fits: dict[str, float | None] | None = None) -> tuple[str, str]:
    """The paper's Table 2 for one split (Markdown and LaTeX). `fits` gives a learner's best
    validation final-answer accuracy; a learner below `FIT_THRESHOLD` is *not fitted*: its
    out-of-domain cells are withheld (the paper compares learners only from that plateau)."""
    unit = "L" if kind == "length" else "K"
    labels = [r["bin"] for r in rows]
    n_iid = sum(not r["ood"] for r in rows)
    unfit = {v: (fits or {}).get(v) for v in learners if not fitted((fits or {}).get(v, FIT_THRESHOLD))}
    acc = {v: [r[v]["accuracy"] if r.get(v) and not (r["ood"] and v in unfit) else None for r in rows]
           for v in learners}
    md = [f"| **{kind.capitalize()}** bin (×{unit}, {unit}={threshold}) | "
          + " | ".join(f"{lab}{' (IID)' if i < n_iid else ''}" for i, lab in enumerate(labels)) + " |",
          "|---" * (len(labels) + 1) + "|"]
    for v in learners:
        if v in unfit:
            md.append(f"| {learner_name(v)} acc. (%){_unfit_label(unfit[v])} | "
                      + " | ".join("not fitted" if r["ood"] else pct(a) for r, a in zip(rows, acc[v])) + " |")
        else:
            md.append(f"| {learner_name(v)} acc. (%) | " + " | ".join(pct(a) for a in acc[v]) + " |")
    if "rm" in acc and "cot" in acc:
        md.append("| Gap (pt) | " + " | ".join(gap(a, b) for a, b in zip(acc["rm"], acc["cot"])) + " |")
    n = [max((r[v]["n"] for v in learners if r.get(v)), default=0) for r in rows]
    md.append("| n | " + " | ".join(str(k) for k in n) + " |")
    for v in learners:  # the invariance probe (rlmlab probe), where it was run
        probed = [r.get(f"{v}_probe") for r in rows]
        if not any(probed):
            continue
        for key, what in (("position_rate", "positions"), ("answer_rate", "answers")):
            md.append(f"| {learner_name(v)}{', not fitted,' if v in unfit else ''} non-invariant {what} (%) | "
                      + " | ".join(pct(p.get(key)) if p else "–" for p in probed) + " |")
        md.append(f"| {learner_name(v)} probed expressions | "
                  + " | ".join(str(p["n_expressions"]) if p else "–" for p in probed) + " |")
    paper = PAPER_TABLE2.get((kind, threshold))
    if paper:
        for v in (v for v in learners if v in paper):  # the paper has rows for RM and CoT only
            md.append(f"| paper {learner_name(v)} (%) | " + " | ".join(f"{a:.1f}" for a in paper[v]) + " |")

    tex = [r"\begin{tabular}{@{}l*{%d}{c}!{\vrule}*{%d}{c}@{}}" % (n_iid, len(labels) - n_iid), r"\toprule",
           rf"\textbf{{{kind.capitalize()}}} & \multicolumn{{{n_iid}}}{{c}}{{\textbf{{IID}}}} & "
           rf"\multicolumn{{{len(labels) - n_iid}}}{{c}}{{\textbf{{OOD}}}} \\",
           rf"\textbf{{Bin ($\times {unit}$)}} & " + " & ".join(_tex_label(x) for x in labels) + r" \\",
           r"\midrule"]
    for v in learners:
        cells = ["n.f." if r["ood"] and v in unfit else f"${pct(a)}$" for r, a in zip(rows, acc[v])]
        tex.append(rf"\textbf{{{learner_name(v)} acc. (\%)}} & " + " & ".join(cells) + r" \\")
    if "rm" in acc and "cot" in acc:
        tex.append(r"\textbf{Gap (pt)} & " + " & ".join(f"${gap(a, b)}$" for a, b in zip(acc["rm"], acc["cot"]))
                   + r" \\")
    tex += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(md) + "\n", "\n".join(tex).replace("–", "--") + "\n"


def _tex_label(label: str) -> str:
    return "$" + label.replace("<=", r"\le").replace(">=", r"\ge").replace("-", "$--$") + "$"


def plot_bins(path: Path, kind: str, threshold: int, rows: list[dict], learners: list[str],
              unfit: frozenset = frozenset()) -> None:
    """Accuracy per bin with Wilson bands; a learner in `unfit` is drawn in domain only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = list(range(len(rows)))
    for v in learners:
        pts = [(x, r[v]) for x, r in zip(xs, rows) if r.get(v) and not (r["ood"] and v in unfit)]
        if not pts:
            continue
        x = [p[0] for p in pts]
        a = [100 * p[1]["accuracy"] for p in pts]
        lo = [100 * p[1]["ci95"][0] for p in pts]
        hi = [100 * p[1]["ci95"][1] for p in pts]
        label = learner_name(v) + (" (not fitted: in domain only)" if v in unfit else "")
        color, style = learner_line(v)
        line, = ax.plot(x, a, "o", linestyle=style, color=color, label=label)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2)
    n_iid = sum(not r["ood"] for r in rows)
    ax.axvline(n_iid - 0.5, color="gray", ls="--", lw=1)
    ax.set_xticks(xs, [r["bin"] for r in rows], rotation=30)
    ax.set_xlabel(f"bin (multiple of {'L' if kind == 'length' else 'K'}={threshold})")
    ax.set_ylabel("final-answer accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.legend()
    ax.set_title(f"{kind} split, {'L' if kind == 'length' else 'K'}={threshold}: accuracy per bin (95% Wilson)")
    fig.tight_layout()
    for ext in ("png", "pdf"):
        save_figure(fig, path.with_suffix(f".{ext}"))
    plt.close(fig)


def report_threshold(out: Path, meta: dict, dest: Path, job: str) -> dict:
    kind, threshold = meta["kind"], int(meta["threshold"])
    results = {v: eval_results(out, job, v, "eval") for v in learners(out, [job])}
    names = [v for v, r in results.items() if r is not None]
    if not names:
        raise NoResultsError(f"{out}: no evaluation results yet (run `rlmlab run {kind}` first)")
    probes = {v: probe_groups(out, job, v, "eval") for v in names}
    rows = threshold_rows(meta, results, probes)
    runs = training_runs(out, job)
    fits = {v: training_summary(runs[v])["best"] if v in runs else None for v in names}
    unfit = frozenset(v for v in names if not fitted(fits[v]))
    md, tex = threshold_tables(kind, threshold, rows, names, fits)
    t_max = meta["split"].get("t_max")
    diag = []
    for r in rows:
        if r["ood"] and r.get("rm") and r.get("rm_within_tmax"):
            diag.append(f"| {r['bin']} | {pct(r['rm']['accuracy'])} (n={r['rm']['n']}) | "
                        f"{pct(r['rm_within_tmax']['accuracy'])} (n={r['rm_within_tmax']['n']}) |")
    if diag and t_max is not None:
        md += (f"\nFrame-width diagnostic: T_max = {t_max} (widest active frame on the training side); "
               "RM accuracy on all OOD expressions of a bin vs those whose widest frame is within T_max:\n\n"
               "| bin | RM, all | RM, w_max ≤ T_max |\n|---|---|---|\n" + "\n".join(diag) + "\n")
    probed = {v: _probe_rows(out, job, v, "eval") for v in names if v not in unfit}
    predictors = {v: f for v, p in probed.items() if p and (f := failure_predictors(results[v], p))}
    wrong = {v: w for v in names if v not in unfit and (w := wrong_trace_summary(results[v]))}
    md += wrong_trace_table(wrong, f"{'L' if kind == 'length' else 'K'} = {threshold}")
    md += failure_prediction_table(predictors)
    md += _frame_errors(out, job, names, fits)
    (dest / f"table-{job}.md").write_text(md)
    (dest / f"table-{job}.tex").write_text(tex)
    plot_bins(dest / f"bins-{job}", kind, threshold, rows, names, unfit)
    plot_learning_curves(dest / f"curves-{job}", runs)
    return {"job": job, "rows": rows, "t_max": t_max, "best_validation": fits, "not_fitted": sorted(unfit),
            "failure_prediction": predictors, "wrong_ood": wrong}


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
    md += [f"| {learner_name(v)} | {w['n']} | {pct(w['malformed'])} | {tok(w['diverge_median'])} | "
           f"{tok(w['diverge_q1'])} / {tok(w['diverge_q3'])} |" for v, w in summaries.items()]
    return (f"\nHow the wrong out-of-domain answers fail ({threshold_name}; learners that fit only): "
            "the share of traces that end without an answer, and the token at which the produced trace "
            "first leaves the canonical one:\n\n" + "\n".join(md) + "\n")


def _probe_rows(out: Path, job: str, name: str, set_name: str) -> list[dict] | None:
    """`rlmlab probe`'s per-expression rows of a learner's evaluation set, if it was probed."""
    path = out / job / name / "probe" / set_name
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
    md += [f"| {learner_name(v)} | {p['n']} | {p['wrong']} | {auc(p['non_invariance'])} | {auc(p['trace_len'])} |"
           for v, p in predictors.items()]
    return ("\nDoes non-invariance predict which out-of-domain expressions fail? ROC AUC over the probed OOD "
            "expressions (0.5: no better than chance; 95% stratified bootstrap interval); the share of "
            "non-invariant positions of an expression against its trace length as the predictor:\n\n"
            + "\n".join(md) + "\n")


class ThresholdSplit(ExperimentKind):
    """The length split ("length", threshold L) or the depth split ("depth", threshold K)."""

    options = ("threshold", "seeds")
    meta_fields = {"threshold": int, "split": dict}

    def __init__(self, name: str):
        self.name = name

    def threshold(self, preset: ExperimentPreset, threshold: int | None = None) -> int:
        """The threshold asked for, else the preset's; checked before any data is built."""
        from rlmlab.experiments.splits import Threshold

        if threshold is None:
            threshold = preset.length if self.name == "length" else preset.depth
        return Threshold(self.name, threshold).value

    def job_name(self, threshold: int, seed: int = 0) -> str:
        """Folder of the run at `threshold` with training seed index `seed`: seed 0 keeps the
        unsuffixed name that single-seed folders have always used (`length-595`), seed k adds
        `-s<k>` (`length-595-s1`)."""
        return seeded_job(f"{self.name}-{threshold}", seed)

    def identity(self, meta: dict) -> dict:
        return {**super().identity(meta), "threshold": meta.get("threshold")}

    def planned_identity(self, preset, threshold: int | None = None, seeds: list[int] | None = None) -> dict:
        return {**super().planned_identity(preset), "threshold": self.threshold(preset, threshold)}

    def plan(self, preset: ExperimentPreset, out: Path, learners, progress: bool = True,
             threshold: int | None = None, seeds: list[int] | None = None) -> list[Job]:
        """One job per learner and training seed index (default: seed 0 only). Every seed trains
        on the same split and is evaluated on the same expressions; the seed sets the model's
        initialisation and the order of the training data (`train.seed` = 1337 + index)."""
        from rlmlab.experiments.splits import Split, threshold_split

        p = preset
        threshold = self.threshold(p, threshold)
        seeds = check_seeds(seeds)
        data = out / "data" / self.job_name(threshold)
        ensure_data(data, "split.json", lambda: threshold_split(
            load_pool(p, out, progress), self.name, threshold, n_val=p.n_val, per_bin_cap=p.per_bin_cap,
            n_train=p.n_train))
        split = Split.load(data, p.task)
        check_split(data, split.params, p, {"n_val": p.n_val, "per_bin_cap": p.per_bin_cap,
                                            "n_train_requested": p.n_train})
        write_meta(out, self, p, {"threshold": threshold, "split": split.params}, learners)
        return [Job(self.job_name(threshold, seed), v, str(data / "train.parquet"), str(data / "val.parquet"),
                    {"eval": str(data / "eval.parquet")}, p.job_settings(v, seed=seed_value(seed)), p.eval_batch)
                for seed in seeds for v in learners]

    def job_names(self, out: Path, meta: dict) -> list[str]:
        threshold = int(meta["threshold"])
        return [self.job_name(threshold, s) for s in seed_indices(out, self.job_name(threshold))]

    def report(self, out: Path, meta: dict, dest: Path) -> dict:
        return report_threshold(out, meta, dest, self.job_name(int(meta["threshold"])))

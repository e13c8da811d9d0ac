"""Tables and figures of an experiment folder: pure functions of its saved results.

`report(out)` reads `experiment.json` and each learner's `results.jsonl`, and writes
`report/` with the paper's tables (Markdown and LaTeX, same rows and columns as the paper's
Tables 2 and 3), figures (PNG and PDF) and `report.json` with every number shown.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from rlmlab.errors import ConfigError, DataError
from rlmlab.experiments.jobs import read_meta
from rlmlab.learning.learner import learner
from rlmlab.measuring.frame_errors import render_frames
from rlmlab.measuring.results import read_results
from rlmlab.measuring.stats import accuracy, auc_with_interval, bootstrap_ratio, share

PAPER_LEARNERS = ("rm", "cot")  # the paper's two learners, first in every table
FRAME_TABLE_FUNCTIONS = 12  # the most frequent functions out of domain, in `rlmlab frames` tables
# Best validation final-answer accuracy from which a learner counts as having fitted its training
# distribution: the paper reports out-of-domain accuracy only from this plateau on.
FIT_THRESHOLD = 0.99


def fitted(best_validation: float | None) -> bool:
    """Whether a learner whose best validation final-answer accuracy is this reached the plateau."""
    return best_validation is not None and best_validation >= FIT_THRESHOLD - 1e-9


def learner_name(view: str) -> str:
    """Table label of a learner: "RM", "CoT", or the view name (also for a folder whose name
    this version does not know)."""
    try:
        return learner(view).label
    except ConfigError:
        return view


def learners(out: Path, jobs: list[str]) -> list[str]:
    """The learners (views) with a run folder in any of `jobs`: RM and CoT first, then the rest
    by name, so that a third view run with `rlmlab run --views` gets its own rows."""
    found = {d.name for job in jobs if (out / job).is_dir() for d in (out / job).iterdir()
             if (d / "eval").is_dir()}
    return _paper_order(found)


def _save(fig, path: Path) -> None:
    """Figures without a creation date, so that re-running a report rewrites identical files."""
    meta = {"CreationDate": None} if path.suffix == ".pdf" else {"Software": None}
    fig.savefig(path, dpi=150, metadata=meta)


def _paper_order(views) -> list[str]:
    return [v for v in PAPER_LEARNERS if v in views] + sorted(set(views) - set(PAPER_LEARNERS))


def training_runs(out: Path, job: str) -> dict[str, Path]:
    """Every run folder of `job` with a learning curve, finished or not (RM and CoT first)."""
    if not (out / job).is_dir():
        return {}
    found = {d.name: d for d in (out / job).iterdir() if (d / "metrics.jsonl").exists()}
    return {v: found[v] for v in _paper_order(found)}

# The paper's Table 2 (representative splits L=595, K=10), for side-by-side reading.
PAPER_TABLE2 = {
    ("length", 595): {"rm": [100.0, 100.0, 99.6, 99.3, 99.3, 99.6, 98.6, 95.7, 92.4, 76.4],
                      "cot": [100.0, 100.0, 99.6, 79.0, 24.5, 14.2, 10.6, 6.2, 10.1, 9.7]},
    ("depth", 10): {"rm": [100.0, 99.7, 99.6, 100.0, 99.6, 98.6, 98.4, 99.4, 98.6, 98.7],
                    "cot": [100.0, 100.0, 99.3, 68.6, 71.6, 67.9, 63.1, 52.2, 48.2, 38.4]},
}
# The paper's Table 3: IID RM, IID CoT, OOD RM, OOD CoT accuracy and CoT shortcut rate (%).
PAPER_TABLE3 = {
    "copy_deep_return": (100.0, 100.0, 87.3, 7.0, 92.7),
    "hidden_literal": (90.3, 99.7, 86.0, 0.3, 99.3),
    "long_range_aggregate": (99.7, 100.0, 95.7, 10.3, 88.0),
    "near_answer_aggregate": (100.0, 100.0, 99.7, 1.0, 79.7),
    "position_weighted_aggregate": (100.0, 100.0, 97.0, 14.7, 69.7),
    "position_parity": (100.0, 100.0, 99.7, 9.7, 90.3),
}


def _results(out: Path, job: str, view: str, set_name: str) -> list[dict] | None:
    path = out / job / view / "eval" / set_name / "results.jsonl"
    return read_results(path) if path.exists() else None


def _saved_list(out: Path, job: str, view: str, tool: str, set_name: str, key: str) -> list[dict] | None:
    """The list under `key` of a learner's `<view>/<tool>/<set>/summary.json`, if there is one
    (`rlmlab probe|frames <out>/<job>/<view> --data <the set's parquet>` writes it)."""
    path = out / job / view / tool / set_name / "summary.json"
    if not path.exists():
        return None
    what = f"{path}: not an `rlmlab {tool}` summary"
    try:
        items = json.loads(path.read_text())[key]
    except (ValueError, KeyError, TypeError):  # UnicodeDecodeError is a ValueError
        raise DataError(what) from None
    if not (isinstance(items, list) and all(isinstance(g, dict) for g in items)):
        raise DataError(f"{what} (its '{key}' should be a list of objects)")
    return items


def _probe_groups(out: Path, job: str, view: str, set_name: str) -> list[dict] | None:
    """The groups of `rlmlab probe`'s summary for a learner's evaluation set, if it was probed."""
    return _saved_list(out, job, view, "probe", set_name, "groups")


def _frame_errors(out: Path, job: str, views: list[str]) -> str:
    """Markdown sections with `rlmlab frames`' table of each learner whose evaluation set was
    scored frame by frame (`<view>/frames/eval/`); empty when none was."""
    md = ""
    for v in views:
        rows = _saved_list(out, job, v, "frames", "eval", "rows")
        if not rows:
            continue
        try:
            table = render_frames(rows, top=FRAME_TABLE_FUNCTIONS)
        except (KeyError, TypeError):
            raise DataError(f"{out / job / v / 'frames' / 'eval' / 'summary.json'}: malformed rows") from None
        md += (f"\nTeacher-forced errors per active-frame example, {learner_name(v)} (`rlmlab frames`; an "
               "example is wrong if any of its targets is mispredicted; seen: the frame's call occurs among "
               "the frames of the training traces):\n\n" + table + "\n")
    return md


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _count_ci(a: dict | None) -> str:
    """An `accuracy()` record as "k/n = p [lo, hi]" (percent, 95% Wilson interval)."""
    if a is None:
        return "–"
    return f"{a['correct']}/{a['n']} = {_pct(a['accuracy'])} [{_pct(a['ci95'][0])}, {_pct(a['ci95'][1])}]"


def _gap(a: float | None, b: float | None) -> str:
    return "–" if a is None or b is None else f"{100 * (a - b):+.1f}"


# --- length / depth -------------------------------------------------------------------------

def threshold_rows(meta: dict, results: dict[str, list[dict] | None],
                   probes: dict[str, list[dict] | None] | None = None) -> list[dict]:
    """One dict per bin: label, IID/OOD, and per learner n, accuracy and Wilson interval, plus
    the learner's probe figures for the bin (`<view>_probe`) where it was probed."""
    by_bin = {v: {g["group"]: g for g in groups if g.get("group_by") == "bin"}
              for v, groups in (probes or {}).items() if groups}
    rows = []
    for b in meta["split"]["bins"]:
        row = {"bin": b["label"], "ood": b["ood"], "available": b["available"]}
        for view, res in results.items():
            if res is None:
                continue
            in_bin = [r for r in res if r.get("bin") == b["label"]]
            row[view] = accuracy(in_bin) if in_bin else None
            within = [r for r in in_bin if r.get("within_tmax")]
            row[f"{view}_within_tmax"] = accuracy(within) if within else None
        for view, groups in by_bin.items():
            row[f"{view}_probe"] = groups.get(b["label"])
        rows.append(row)
    return rows


def threshold_tables(kind: str, threshold: int, rows: list[dict], views: list[str],
                     fits: dict[str, float | None] | None = None) -> tuple[str, str]:
    """The paper's Table 2 for one split (Markdown and LaTeX). `fits` gives a learner's best
    validation final-answer accuracy; a learner below `FIT_THRESHOLD` is *not fitted*: its
    out-of-domain cells are withheld (the paper compares learners only from that plateau)."""
    unit = "L" if kind == "length" else "K"
    labels = [r["bin"] for r in rows]
    n_iid = sum(not r["ood"] for r in rows)
    unfit = {v: (fits or {}).get(v) for v in views if not fitted((fits or {}).get(v, FIT_THRESHOLD))}
    acc = {v: [r[v]["accuracy"] if r.get(v) and not (r["ood"] and v in unfit) else None for r in rows]
           for v in views}
    md = [f"| **{kind.capitalize()}** bin (×{unit}, {unit}={threshold}) | "
          + " | ".join(f"{lab}{' (IID)' if i < n_iid else ''}" for i, lab in enumerate(labels)) + " |",
          "|---" * (len(labels) + 1) + "|"]
    for v in views:
        if v in unfit:
            md.append(f"| {learner_name(v)} acc. (%), not fitted (best validation {_pct(unfit[v])}) | "
                      + " | ".join("not fitted" if r["ood"] else _pct(a) for r, a in zip(rows, acc[v])) + " |")
        else:
            md.append(f"| {learner_name(v)} acc. (%) | " + " | ".join(_pct(a) for a in acc[v]) + " |")
    if "rm" in acc and "cot" in acc:
        md.append("| Gap (pt) | " + " | ".join(_gap(a, b) for a, b in zip(acc["rm"], acc["cot"])) + " |")
    n = [max((r[v]["n"] for v in views if r.get(v)), default=0) for r in rows]
    md.append("| n | " + " | ".join(str(k) for k in n) + " |")
    for v in views:  # the invariance probe (rlmlab probe), where it was run
        probed = [r.get(f"{v}_probe") for r in rows]
        if not any(probed):
            continue
        for key, what in (("position_rate", "positions"), ("answer_rate", "answers")):
            md.append(f"| {learner_name(v)} non-invariant {what} (%) | "
                      + " | ".join(_pct(p.get(key)) if p else "–" for p in probed) + " |")
        md.append(f"| {learner_name(v)} probed expressions | "
                  + " | ".join(str(p["n_expressions"]) if p else "–" for p in probed) + " |")
    paper = PAPER_TABLE2.get((kind, threshold))
    if paper:
        for v in (v for v in views if v in paper):  # the paper has rows for RM and CoT only
            md.append(f"| paper {learner_name(v)} (%) | " + " | ".join(f"{a:.1f}" for a in paper[v]) + " |")

    tex = [r"\begin{tabular}{@{}l*{%d}{c}!{\vrule}*{%d}{c}@{}}" % (n_iid, len(labels) - n_iid), r"\toprule",
           rf"\textbf{{{kind.capitalize()}}} & \multicolumn{{{n_iid}}}{{c}}{{\textbf{{IID}}}} & "
           rf"\multicolumn{{{len(labels) - n_iid}}}{{c}}{{\textbf{{OOD}}}} \\",
           rf"\textbf{{Bin ($\times {unit}$)}} & " + " & ".join(_tex_label(x) for x in labels) + r" \\",
           r"\midrule"]
    for v in views:
        cells = ["n.f." if r["ood"] and v in unfit else f"${_pct(a)}$" for r, a in zip(rows, acc[v])]
        tex.append(rf"\textbf{{{learner_name(v)} acc. (\%)}} & " + " & ".join(cells) + r" \\")
    if "rm" in acc and "cot" in acc:
        tex.append(r"\textbf{Gap (pt)} & " + " & ".join(f"${_gap(a, b)}$" for a, b in zip(acc["rm"], acc["cot"]))
                   + r" \\")
    tex += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(md) + "\n", "\n".join(tex).replace("–", "--") + "\n"


def _tex_label(label: str) -> str:
    return "$" + label.replace("<=", r"\le").replace(">=", r"\ge").replace("-", "$--$") + "$"


def plot_bins(path: Path, kind: str, threshold: int, rows: list[dict], views: list[str],
              unfit: frozenset = frozenset()) -> None:
    """Accuracy per bin with Wilson bands; a learner in `unfit` is drawn in domain only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = list(range(len(rows)))
    colors = {"rm": "#1f5fa8", "cot": "#c0392b"}
    for v in views:
        pts = [(x, r[v]) for x, r in zip(xs, rows) if r.get(v) and not (r["ood"] and v in unfit)]
        if not pts:
            continue
        x = [p[0] for p in pts]
        a = [100 * p[1]["accuracy"] for p in pts]
        lo = [100 * p[1]["ci95"][0] for p in pts]
        hi = [100 * p[1]["ci95"][1] for p in pts]
        label = learner_name(v) + (" (not fitted: in domain only)" if v in unfit else "")
        line, = ax.plot(x, a, "o-", color=colors.get(v), label=label)
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
        _save(fig, path.with_suffix(f".{ext}"))
    plt.close(fig)


def metrics_records(run_dir: Path) -> list[dict]:
    """The records of a run's metrics.jsonl; a line cut short by a killed run is skipped."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    recs = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            recs.append(rec)
    return recs


def plot_learning_curves(path: Path, runs: dict[str, Path]) -> bool:
    """Validation answer accuracy and loss against wall-clock training minutes, per learner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4))
    drawn = False
    for view, run_dir in runs.items():
        val = [r for r in metrics_records(run_dir) if r.get("kind") == "val" and "elapsed_s" in r]
        if not val:
            continue
        drawn = True
        x = [r["elapsed_s"] / 60 for r in val]
        if any("answer_acc" in r for r in val):
            a1.plot(x, [100 * r.get("answer_acc", float("nan")) for r in val], label=learner_name(view))
        a2.plot(x, [r["loss"] for r in val], label=learner_name(view))
    a1.set_xlabel("training minutes")
    a1.set_ylabel("val final-answer acc (%)")
    a2.set_xlabel("training minutes")
    a2.set_ylabel("val loss (teacher-forced)")
    a2.set_yscale("log")
    for a in (a1, a2):
        if a.get_legend_handles_labels()[0]:
            a.legend()
    fig.tight_layout()
    if drawn:
        for ext in ("png", "pdf"):
            _save(fig, path.with_suffix(f".{ext}"))
    plt.close(fig)
    return drawn


def report_threshold(out: Path, meta: dict, dest: Path) -> dict:
    kind, threshold = meta["kind"], int(meta["threshold"])
    job = f"{kind}-{threshold}"
    results = {v: _results(out, job, v, "eval") for v in learners(out, [job])}
    views = [v for v, r in results.items() if r is not None]
    if not views:
        raise DataError(f"{out}: no evaluation results yet (run `rlmlab run {kind}` first)")
    probes = {v: _probe_groups(out, job, v, "eval") for v in views}
    rows = threshold_rows(meta, results, probes)
    runs = training_runs(out, job)
    fits = {v: training_summary(runs[v])["best"] if v in runs else None for v in views}
    unfit = frozenset(v for v in views if not fitted(fits[v]))
    md, tex = threshold_tables(kind, threshold, rows, views, fits)
    t_max = meta["split"].get("t_max")
    diag = []
    for r in rows:
        if r["ood"] and r.get("rm") and r.get("rm_within_tmax"):
            diag.append(f"| {r['bin']} | {_pct(r['rm']['accuracy'])} (n={r['rm']['n']}) | "
                        f"{_pct(r['rm_within_tmax']['accuracy'])} (n={r['rm_within_tmax']['n']}) |")
    if diag and t_max is not None:
        md += (f"\nFrame-width diagnostic: T_max = {t_max} (widest active frame on the training side); "
               "RM accuracy on all OOD expressions of a bin vs those whose widest frame is within T_max:\n\n"
               "| bin | RM, all | RM, w_max ≤ T_max |\n|---|---|---|\n" + "\n".join(diag) + "\n")
    probed = {v: _probe_rows(out, job, v, "eval") for v in views if v not in unfit}
    predictors = {v: f for v, p in probed.items() if p and (f := failure_predictors(results[v], p))}
    md += failure_prediction_table(predictors)
    md += _frame_errors(out, job, views)
    (dest / f"table-{job}.md").write_text(md)
    (dest / f"table-{job}.tex").write_text(tex)
    plot_bins(dest / f"bins-{job}", kind, threshold, rows, views, unfit)
    plot_learning_curves(dest / f"curves-{job}", runs)
    return {"job": job, "rows": rows, "t_max": t_max, "best_validation": fits, "not_fitted": sorted(unfit),
            "failure_prediction": predictors}


def _probe_rows(out: Path, job: str, view: str, set_name: str) -> list[dict] | None:
    """`rlmlab probe`'s per-expression rows of a learner's evaluation set, if it was probed."""
    path = out / job / view / "probe" / set_name / "results.jsonl"
    return read_results(path, required=("expr", "positions", "position_differ")) if path.exists() else None


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


# --- IID sweep ------------------------------------------------------------------------------

def iid_points(out: Path, sizes: list[int]) -> list[dict]:
    """Per (N, learner): final-answer and per-token test accuracy, averaged over seeds.

    Every seed is tested on the same expressions, so seeds are not independent samples: with
    one seed the final-answer interval is Wilson's, with several both intervals come from a
    bootstrap over test expressions that keeps each expression's seeds together."""
    points = []
    jobs = _iid_jobs(out)
    views = learners(out, list(jobs))
    for n in sizes:
        for view in views:
            per_seed = [res for job, (size, _) in jobs.items() if size == n
                        if (res := _results(out, job, view, "test")) is not None]
            if not per_seed:
                continue
            exprs = [r["expr"] for r in per_seed[0]]
            if any([r["expr"] for r in res] != exprs for res in per_seed[1:]):
                raise DataError(f"{out}: the seeds of N={n} ({learner_name(view)}) were tested on "
                                "different expressions")
            by_expr = list(zip(*per_seed))  # per test expression, its result under every seed
            k = len(per_seed)
            p = {"N": n, "view": view, "seeds": k, **accuracy([r for res in per_seed for r in res])}
            if k > 1:
                p["ci95"] = list(bootstrap_ratio([sum(r["correct"] for r in rs) for rs in by_expr], [k] * len(by_expr)))
            if all("tf_total" in res[0] for res in per_seed):
                c = [sum(r["tf_correct"] for r in rs) for rs in by_expr]
                t = [sum(r["tf_total"] for r in rs) for rs in by_expr]
                p["per_token"] = sum(c) / sum(t)
                p["per_token_ci95"] = list(bootstrap_ratio(c, t))
            points.append(p)
    return points


def _iid_jobs(out: Path) -> dict[str, tuple[int, int]]:
    """The IID run folders and their (size, seed), by size then seed (`iid-N300-s0`, ...)."""
    found = {}
    for d in out.glob("iid-N*-s*"):
        m = re.fullmatch(r"iid-N(\d+)-s(\d+)", d.name)
        if m and d.is_dir():  # a stray folder with a similar name is not a run
            found[d.name] = (int(m[1]), int(m[2]))
    return dict(sorted(found.items(), key=lambda item: item[1]))


def training_summary(run_dir: Path) -> dict:
    """Steps, tokens, epochs, minutes and best validation answer accuracy of a run, finished or not."""
    recs = metrics_records(run_dir)
    val = [r for r in recs if r.get("kind") == "val" and "answer_acc" in r]
    best = max(val, key=lambda r: r["answer_acc"], default=None)
    last = recs[-1] if recs else {}
    ended = last.get("kind") == "end"
    return {"step": last.get("step", 0), "tokens": max((r.get("tokens", 0) for r in recs), default=0),
            "epochs": max((r.get("epoch", 0) for r in recs), default=0),
            "minutes": last.get("elapsed_s", 0) / 60, "best": best and best["answer_acc"],
            "best_step": best and best["step"], "stop": last.get("reason", "?") if ended else "in progress",
            "validations": [{k: r[k] for k in ("step", "elapsed_s", "answer_acc", "token_acc") if k in r}
                            for r in val]}


def _epochs(e: float) -> str:
    return f"{e:.2f}" if e < 10 else f"{e:,.0f}"  # a small IID set is passed hundreds of times


def training_table(summaries: list[dict]) -> str:
    """Markdown table of `training_summary` records (each with its `job` and `view`)."""
    md = ["| run | learner | steps | training tokens | epochs | minutes | best val final answer (%) | at step | stop |",
          "|---|---|---|---|---|---|---|---|---|"]
    for t in summaries:
        md.append(f"| {t['job']} | {learner_name(t['view'])} | {t['step']:,} | {t['tokens'] / 1e6:.1f}M | "
                  f"{_epochs(t['epochs'])} | {t['minutes']:.0f} | {_pct(t['best'])} | "
                  f"{'–' if t['best_step'] is None else format(t['best_step'], ',')} | {t['stop']} |")
    curves = [f"- {t['job']} {learner_name(t['view'])}: " + ", ".join(
        f"{_pct(v['answer_acc'])} / {_pct(v.get('token_acc'))} ({v['step']:,}; {v.get('elapsed_s', 0) / 60:.0f} min)"
        for v in t["validations"]) for t in summaries if t["validations"]]
    return ("Training runs (validation final-answer accuracy picks the checkpoint that is tested; "
            "`minutes` is wall-clock training time, validation included):\n\n" + "\n".join(md) + "\n"
            + ("\nValidation final-answer / teacher-forced token accuracy (%) at each validation (step; minutes):\n\n"
               + "\n".join(curves) + "\n" if curves else ""))


def report_iid(out: Path, meta: dict, dest: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = iid_points(out, meta["sizes"])
    if not points:
        raise DataError(f"{out}: no IID test results yet (run `rlmlab run iid` first)")
    md = ["| N | learner | seeds | final answer (%) | 95% CI | per-token (%) | 95% CI |", "|---|---|---|---|---|---|---|"]
    for p in points:
        ci = p["ci95"]
        tok = p.get("per_token")
        tci = p.get("per_token_ci95")
        md.append(f"| {p['N']} | {learner_name(p['view'])} | {p['seeds']} | {_pct(p['accuracy'])} | "
                  f"{_pct(ci[0])}–{_pct(ci[1])} | {_pct(tok)} | "
                  f"{'–' if tci is None else _pct(tci[0]) + '–' + _pct(tci[1])} |")
    tex = [r"\begin{tabular}{@{}rlrrr@{}}", r"\toprule", r"$N$ & learner & seeds & final answer (\%) & per-token (\%) \\",
           r"\midrule"] + [f"{p['N']} & {learner_name(p['view'])} & {p['seeds']} & {_pct(p['accuracy'])} & "
                           f"{_pct(p.get('per_token'))} \\\\" for p in points] + [r"\bottomrule", r"\end{tabular}"]
    skipped = meta.get("skipped_sizes")
    if skipped:
        md.append(f"\nNot run: N = {', '.join(map(str, skipped['sizes']))} ({skipped['reason']}).")
    cap = meta.get("split", {}).get("max_trace_len")
    if cap is not None:
        md.append(f"\nIID split drawn from the pool's expressions whose trace has at most {cap} tokens "
                  "(`iid_max_trace`; the paper's uses the whole generator).")
    (dest / "table-iid.md").write_text("\n".join(md) + "\n")
    (dest / "table-iid.tex").write_text("\n".join(tex).replace("–", "--") + "\n")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4))
    colors = {"rm": "#1f5fa8", "cot": "#c0392b"}
    for view in dict.fromkeys(p["view"] for p in points):
        color = colors.get(view)
        ps = [p for p in points if p["view"] == view]
        if not ps:
            continue
        x = [p["N"] for p in ps]
        line, = a1.plot(x, [100 * p["accuracy"] for p in ps], "o-", color=color, label=learner_name(view))
        color = line.get_color()
        a1.fill_between(x, [100 * p["ci95"][0] for p in ps], [100 * p["ci95"][1] for p in ps], color=color, alpha=0.2)
        if all("per_token" in p for p in ps):
            a2.plot(x, [100 * p["per_token"] for p in ps], "o-", color=color, label=learner_name(view))
            a2.fill_between(x, [100 * p["per_token_ci95"][0] for p in ps], [100 * p["per_token_ci95"][1] for p in ps],
                            color=color, alpha=0.2)
    for a, title in ((a1, "final-answer test accuracy (%)"), (a2, "per-token test accuracy (%)")):
        a.set_xscale("log")
        a.set_xlabel("training expressions N")
        a.set_ylabel(title)
        a.legend()
    fig.tight_layout()
    for ext in ("png", "pdf"):
        _save(fig, dest / f"iid-sample-complexity.{ext}")
    plt.close(fig)
    for job in _iid_jobs(out):
        plot_learning_curves(dest / f"curves-{job}", training_runs(out, job))
    return {"points": points}


# --- shortcuts ------------------------------------------------------------------------------

def report_shortcuts(out: Path, meta: dict, dest: Path) -> dict:
    from rlmlab.experiments.shortcuts import shortcut_rate

    rows = []
    views = learners(out, [f"shortcut-{name}" for name in meta["constructions"]])
    for name in meta["constructions"]:
        job = f"shortcut-{name}"
        row = {"construction": name}
        for view in views:
            iid, ood = _results(out, job, view, "iid"), _results(out, job, view, "ood")
            if iid is not None:
                row[f"{view}_iid"] = accuracy(iid)
            if ood is not None:
                row[f"{view}_ood"] = accuracy(ood)
                row[f"{view}_shortcut_rate"] = shortcut_rate(ood)
                row[f"{view}_ood_valid"] = sum(bool(r.get("valid")) for r in ood) / len(ood)
            for set_name in ("iid", "ood"):
                probed = _probe_groups(out, job, view, set_name)
                if probed:
                    row[f"{view}_probe_{set_name}"] = probed[0]
        rows.append(row)
    if not any(len(r) > 1 for r in rows):
        raise DataError(f"{out}: no shortcut results yet (run `rlmlab run shortcuts` first)")

    def acc(r, key):
        return r[key]["accuracy"] if key in r else None

    # One column per probed learner: the theorem's quantity, non-invariant prediction points,
    # on the training distribution (IID) and where S stops agreeing with the answer (OOD).
    probed = [v for v in views if any(f"{v}_probe_{s}" in r for r in rows for s in ("iid", "ood"))]
    probe_cols = [f"Non-invariant positions IID / OOD, {learner_name(v)} (%)" for v in probed]

    def probe_cell(r, v):
        return " / ".join(_pct(r.get(f"{v}_probe_{s}", {}).get("position_rate")) for s in ("iid", "ood"))

    md = ["| Construction | IID RM acc. | IID CoT acc. | OOD RM acc. | OOD CoT acc. | Gap (pt) | Shortcut rate (CoT) "
          "| Shortcut rate (RM) | paper (IID RM/CoT, OOD RM/CoT, rate) |" + "".join(f" {c} |" for c in probe_cols),
          "|---" * (9 + len(probe_cols)) + "|"]
    tex = [r"\begin{tabular}{@{}lcc!{\vrule}cccc@{}}", r"\toprule",
           r"Construction & RM acc. & CoT acc. & RM acc. & CoT acc. & Gap (pt) & Shortcut rate \\", r"\midrule"]
    for r in rows:
        p = PAPER_TABLE3.get(r["construction"])
        cells = [_pct(acc(r, "rm_iid")), _pct(acc(r, "cot_iid")), _pct(acc(r, "rm_ood")), _pct(acc(r, "cot_ood")),
                 _gap(acc(r, "rm_ood"), acc(r, "cot_ood")), _pct(r.get("cot_shortcut_rate"))]
        md.append(f"| {r['construction']} | " + " | ".join(cells) + f" | {_pct(r.get('rm_shortcut_rate'))} | "
                  + ("–" if p is None else " / ".join(f"{x:.1f}" for x in p)) + " |"
                  + "".join(f" {probe_cell(r, v)} |" for v in probed))
        tex.append(r["construction"].replace("_", r"\_") + " & " + " & ".join(cells) + r" \\")
    tex += [r"\bottomrule", r"\end{tabular}"]
    md += ["", "Final-answer accuracy and shortcut rate (OOD answers equal to S) with 95% Wilson intervals; "
           "well-formed: OOD traces that end in an answer:", "",
           "| Construction | Learner | IID correct / n | OOD correct / n | OOD answers = S | OOD well-formed (%) |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        for v in views:
            if f"{v}_iid" not in r and f"{v}_ood" not in r:
                continue
            ood = r.get(f"{v}_ood")
            follow = None if ood is None else share(round(r[f"{v}_shortcut_rate"] * ood["n"]), ood["n"])
            md.append(f"| {r['construction']} | {learner_name(v)} | {_count_ci(r.get(f'{v}_iid'))} | "
                      f"{_count_ci(ood)} | {_count_ci(follow)} | {_pct(r.get(f'{v}_ood_valid'))} |")
    for name in meta["constructions"]:
        job = f"shortcut-{name}"
        plot_learning_curves(dest / f"curves-{job}", training_runs(out, job))
    (dest / "table-shortcuts.md").write_text("\n".join(md) + "\n")
    if probed:
        (dest / "table-shortcuts-probe.md").write_text(shortcut_probe_table(rows, probed))
    (dest / "table-shortcuts.tex").write_text("\n".join(tex).replace("–", "--") + "\n")
    return {"rows": rows}


def shortcut_probe_table(rows: list[dict], views: list[str]) -> str:
    """The invariance probe per construction, learner and set, with 95% intervals, next to the
    learner's accuracy on the whole set (the probe may take its first expressions only) and
    (OOD) its shortcut rate."""

    def ci(p, key):  # a probe run with --positions-only (or answers only) lacks the other level
        if p.get(f"{key}_rate") is None:
            return "–"
        lo, hi = p[f"{key}_ci95"]
        return f"{100 * p[f'{key}_rate']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"

    md = ["| Construction | Learner | Set | Probed expr. | Non-invariant positions (%) | Witness positions (%) "
          "| Non-invariant answers (%) | Subproblems | Accuracy, whole set (%) | Shortcut rate, whole set (%) |",
          "|---" * 10 + "|"]
    for r in rows:
        for v in views:
            for s in ("iid", "ood"):
                p = r.get(f"{v}_probe_{s}")
                if p is None:
                    continue
                acc = r.get(f"{v}_{s}", {}).get("accuracy")
                rate = r.get(f"{v}_shortcut_rate") if s == "ood" else None
                md.append(f"| {r['construction']} | {learner_name(v)} | {s.upper()} | {p['n_expressions']} | "
                          f"{ci(p, 'position')} | {ci(p, 'witness')} | {ci(p, 'answer')} | "
                          f"{p.get('subproblems', '–')} | "
                          f"{_pct(acc)} | {_pct(rate)} |")
    return "\n".join(md) + "\n"


# --- recipe comparisons ----------------------------------------------------------------------

RECIPE_MARKS_MIN = (15, 30, 45, 60, 90, 120)
"""Training minutes at which the recipe table reads each run's best validation so far."""


def _clock_s(record: dict) -> float:
    """A record's training time: the process's CPU time where logged (one thread: the wall clock the
    run would have taken on a core of its own, whatever else ran beside it), else the wall clock."""
    return record.get("cpu_s", record["elapsed_s"])


def _model_shape(model: dict, view: str) -> str:
    from rlmlab.learning.config import PRESETS

    try:
        family = learner(view).observation.family
    except ConfigError:
        family = "cot"
    base = PRESETS.get(model.get("preset"), {}).get(family, {})
    shape = {k: model.get(k) if model.get(k) is not None else base.get(k) for k in ("n_layer", "n_head", "n_embd")}
    return f"{shape['n_layer']}L/{shape['n_head']}H/{shape['n_embd']}"


def recipe_row(name: str, run_dir: Path) -> dict:
    """One training run of a recipe comparison: its settings and its validation answer accuracy
    against training minutes (`_clock_s`; best so far at each of `RECIPE_MARKS_MIN`, first minute at 99%)."""
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        model, data, train = cfg["model"], cfg["data"], cfg["train"]
    except (OSError, ValueError, KeyError, TypeError):
        raise DataError(f"{run_dir}: no readable config.json (not an `rlmlab train` run folder)") from None
    recs = metrics_records(run_dir)
    val = [r for r in recs if r.get("kind") == "val" and "answer_acc" in r and "elapsed_s" in r]
    steps = [r for r in recs if r.get("kind") == "train" and r.get("step")]
    summary = training_summary(run_dir)
    reached = next((r for r in val if r["answer_acc"] >= 0.99), None)
    return {"run": name, "view": data.get("view"), "shape": _model_shape(model, data.get("view")),
            "batch": train.get("batch_size"), "lr": train.get("lr"), "warmup": train.get("warmup_steps"),
            "positions_per_step": round(steps[-1]["tokens"] / steps[-1]["step"]) if steps else None,
            "step": summary["step"], "tokens": summary["tokens"], "minutes": summary["minutes"],
            "cpu_minutes": max((r.get("cpu_s", 0) for r in recs), default=0) / 60, "stop": summary["stop"],
            "at": {m: max((r["answer_acc"] for r in val if _clock_s(r) <= 60 * m), default=None)
                   for m in RECIPE_MARKS_MIN if val and _clock_s(val[-1]) >= 60 * m - 30},
            "best": summary["best"], "minutes_to_99": reached and _clock_s(reached) / 60,
            "last_token_acc": val[-1].get("token_acc") if val else None,
            "curve": [{k: r[k] for k in ("step", "elapsed_s", "cpu_s", "answer_acc", "token_acc", "loss") if k in r}
                      for r in val]}


def recipe_table(rows: list[dict]) -> str:
    marks = [m for m in RECIPE_MARKS_MIN if any(m in r["at"] for r in rows)]
    head = ["run", "learner", "model", "batch (positions/step)", "lr", "warm-up", "steps", "wall (CPU) minutes",
            *(f"≤{m} min" for m in marks), "best", "at 99% (min)", "last token acc"]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        pos = "–" if r["positions_per_step"] is None else f"{r['positions_per_step']:,}"
        cells = [r["run"], learner_name(r["view"]), r["shape"], f"{r['batch']} ({pos})", f"{r['lr']:g}",
                 str(r["warmup"]), f"{r['step']:,}", f"{r['minutes']:.0f} ({r['cpu_minutes']:.0f})",
                 *(_pct(r["at"].get(m)) for m in marks), _pct(r["best"]),
                 "–" if r["minutes_to_99"] is None else f"{r['minutes_to_99']:.0f}", _pct(r["last_token_acc"])]
        md.append("| " + " | ".join(cells) + " |")
    return ("Validation final-answer accuracy (%), best so far within each budget of training minutes, "
            "validation included, counted in the process's CPU time (one thread: the wall clock of a run with a "
            "core of its own; the wall clock it took is beside it):\n\n"
            + "\n".join(md) + "\n")


def plot_recipe(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for r in rows:
        if not r["curve"]:
            continue
        x = [_clock_s(c) / 60 for c in r["curve"]]
        style = "-" if r["view"] == "cot" else "--"
        line, = axes[0].plot(x, [100 * c["answer_acc"] for c in r["curve"]], style, label=r["run"])
        axes[1].plot(x, [100 * (1 - c["token_acc"]) for c in r["curve"]], style, color=line.get_color())
        axes[2].plot(x, [c["loss"] for c in r["curve"]], style, color=line.get_color())
    for a, label in zip(axes, ("val final-answer acc (%)", "val token error, teacher-forced (%)",
                               "val loss (teacher-forced)")):
        a.set_xlabel("training minutes (CPU time, one thread)")
        a.set_ylabel(label)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    for ext in ("png", "pdf"):
        _save(fig, path.with_suffix(f".{ext}"))
    plt.close(fig)


def report_recipe(out: Path, meta: dict, dest: Path) -> dict:
    rows = [recipe_row(name, out / name) for name in meta["runs"] if (out / name / "metrics.jsonl").exists()]
    if not rows:
        raise DataError(f"{out}: none of the runs listed in experiment.json has a metrics.jsonl yet")
    (dest / "table-recipe.md").write_text(recipe_table(rows))
    plot_recipe(dest / "recipe-curves", rows)
    return {"runs": rows}


def _job_names(out: Path, meta: dict) -> list[str]:
    """The experiment's job folders, in the order of its tables."""
    if meta["kind"] == "iid":
        return list(_iid_jobs(out))
    if meta["kind"] == "shortcuts":
        return [f"shortcut-{name}" for name in meta["constructions"]]
    if meta["kind"] == "recipe":
        return []
    return [f"{meta['kind']}-{int(meta['threshold'])}"]


def report(out: str | Path) -> Path:
    """Write `<out>/report/` from the saved results; returns that folder."""
    out = Path(out)
    meta = read_meta(out)
    dest = out / "report"
    dest.mkdir(exist_ok=True)
    kind = meta.get("kind")
    if kind in ("length", "depth"):
        data = report_threshold(out, meta, dest)
    elif kind == "iid":
        data = report_iid(out, meta, dest)
    elif kind == "shortcuts":
        data = report_shortcuts(out, meta, dest)
    elif kind == "recipe":
        data = report_recipe(out, meta, dest)
    else:
        raise DataError(f"{out}/experiment.json: unknown kind {kind!r}")
    data["training"] = [{"job": job, "view": view, **training_summary(run_dir)}
                        for job in _job_names(out, meta) for view, run_dir in training_runs(out, job).items()]
    if data["training"]:
        (dest / "table-training.md").write_text(training_table(data["training"]))
    else:
        (dest / "table-training.md").unlink(missing_ok=True)
    (dest / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    return dest


# Weights and data files stay behind: a run's data is rebuilt from the seed-42 pool by the
# command in commands.jsonl, and checkpoints are megabytes each.
LEFT_OUT_SUFFIXES = (".parquet", ".safetensors", ".npz")


def export_results(src: str | Path, dest: str | Path) -> dict:
    """Copy an experiment folder's results to `dest` (e.g. under `results/` to commit them):
    configs, metrics, per-expression results, probe summaries and commands, without
    checkpoints or data files, then rebuild the report there from the copy.

    Files already in `dest` that the source lacks (a README, say) are kept; files the source
    has are overwritten, except the two that describe the whole experiment: when `dest` holds
    the results of other runs of the same experiment (another session, machine or subset of
    constructions or sizes), `experiment.json` lists what either planned and `commands.jsonl`
    keeps both histories (`merge_meta`, `merge_commands`). Returns counts of what was copied
    and left out."""
    src, dest = Path(src).resolve(), Path(dest).resolve()
    meta = read_meta(src)
    if dest == src or src in dest.parents:
        raise DataError(f"{dest}: the export destination must lie outside the experiment folder {src}")
    if (dest / "experiment.json").exists():
        meta = merge_meta(read_meta(dest), meta, dest)
    commands = merge_commands(_lines(dest / "commands.jsonl"), _lines(src / "commands.jsonl"))
    copied = size = checkpoints = data_files = 0
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        rebuilt = rel.parts[0] in ("report", "view")  # the report below; `rlmlab view` pages on demand
        if rebuilt or not path.is_file() or rel.parts in (("experiment.json",), ("commands.jsonl",)):
            continue
        if any((src / Path(*rel.parts[:i]) / "checkpoint.json").exists() for i in range(1, len(rel.parts))):
            checkpoints += path.name == "checkpoint.json"
            continue
        if path.suffix in LEFT_OUT_SUFFIXES:
            data_files += 1
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / rel)
        copied += 1
        size += path.stat().st_size
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "experiment.json").write_text(json.dumps(meta, indent=2) + "\n")
    if commands:
        (dest / "commands.jsonl").write_text("".join(line + "\n" for line in commands))
    report(dest)
    return {"files": copied, "bytes": size, "checkpoints": checkpoints, "data_files": data_files}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def merge_meta(old: dict, new: dict, where: Path) -> dict:
    """`new`'s experiment description, listing the constructions or sizes either planned; refused
    when the two describe different experiments (kind, threshold)."""
    for key in ("kind", "threshold"):
        if old.get(key) != new.get(key):
            raise DataError(f"{where} holds another experiment ({key} {old.get(key)!r}, exporting {new.get(key)!r}); "
                            "export into another folder")
    merged = dict(new)
    if new["kind"] == "shortcuts":
        from rlmlab.experiments.shortcuts import CONSTRUCTIONS

        either = set(old["constructions"]) | set(new["constructions"])
        merged["constructions"] = [c for c in CONSTRUCTIONS if c in either] + sorted(either - set(CONSTRUCTIONS))
    elif new["kind"] == "iid":
        merged["sizes"] = sorted(set(old["sizes"]) | set(new["sizes"]))
    elif new["kind"] == "recipe":
        merged["runs"] = old["runs"] + [r for r in new["runs"] if r not in old["runs"]]
    return merged


def merge_commands(old: list[str], new: list[str]) -> list[str]:
    """`old` followed by `new`, where the longest end of `old` that begins `new` is written once:
    re-exporting a folder after more commands adds only those, exporting another folder appends
    its history."""
    for k in range(min(len(old), len(new)), 0, -1):
        if old[len(old) - k:] == new[:k]:
            return old[:len(old) - k] + new
    return old + new

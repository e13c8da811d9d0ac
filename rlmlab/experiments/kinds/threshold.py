"""The length and depth splits (the paper's Table 2): one job per learner on the split below a
threshold, tested per multiplier bin above and below it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rlmlab.errors import DataError, NoResultsError
from rlmlab.experiments.diagnostics import (
    failure_prediction_table,
    failure_predictors,
    frame_error_sections,
    frame_width_section,
    plot_bins,
    probe_rows,
    wrong_trace_summary,
    wrong_trace_table,
)
from rlmlab.experiments.folder import check_split, ensure_data, load_pool, write_meta
from rlmlab.experiments.job import Job
from rlmlab.experiments.kinds.base import ExperimentKind
from rlmlab.experiments.presets import ExperimentPreset
from rlmlab.experiments.refs import run_path
from rlmlab.experiments.seeds import check_seeds, seed_indices, seeded_job
from rlmlab.experiments.tables import (
    FIT_THRESHOLD,
    eval_results,
    fitted,
    gap,
    learner_label,
    learners,
    pct,
    probe_groups,
    training_runs,
    unfit_label,
)
from rlmlab.experiments.training_log import plot_learning_curves, training_summary
from rlmlab.measuring.result_files import find_eval_dir, require_fields, results_file
from rlmlab.measuring.stats import accuracy, correctness, paired, seed_cell
from rlmlab.safeio import shorten

if TYPE_CHECKING:
    from rlmlab.task.taskfile import Task

# The paper's Table 2 (representative splits L=595, K=10), for side-by-side reading.
PAPER_TABLE2 = {
    ("length", 595): {"rm": [100.0, 100.0, 99.6, 99.3, 99.3, 99.6, 98.6, 95.7, 92.4, 76.4],
                      "cot": [100.0, 100.0, 99.6, 79.0, 24.5, 14.2, 10.6, 6.2, 10.1, 9.7]},
    ("depth", 10): {"rm": [100.0, 99.7, 99.6, 100.0, 99.6, 98.6, 98.4, 99.4, 98.6, 98.7],
                    "cot": [100.0, 100.0, 99.3, 68.6, 71.6, 67.9, 63.1, 52.2, 48.2, 38.4]},
}



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
            md.append(f"| {learner_label(v)} acc. (%){unfit_label(unfit[v])} | "
                      + " | ".join("not fitted" if r["ood"] else pct(a) for r, a in zip(rows, acc[v])) + " |")
        else:
            md.append(f"| {learner_label(v)} acc. (%) | " + " | ".join(pct(a) for a in acc[v]) + " |")
    if "rm" in acc and "cot" in acc:
        md.append("| Gap (pt) | " + " | ".join(gap(a, b) for a, b in zip(acc["rm"], acc["cot"])) + " |")
    n = [max((r[v]["n"] for v in learners if r.get(v)), default=0) for r in rows]
    md.append("| n | " + " | ".join(str(k) for k in n) + " |")
    for v in learners:  # the invariance probe (rlmlab probe), where it was run
        probed = [r.get(f"{v}_probe") for r in rows]
        if not any(probed):
            continue
        for key, what in (("position_rate", "positions"), ("answer_rate", "answers")):
            md.append(f"| {learner_label(v)}{', not fitted,' if v in unfit else ''} non-invariant {what} (%) | "
                      + " | ".join(pct(p.get(key)) if p else "–" for p in probed) + " |")
        md.append(f"| {learner_label(v)} probed expressions | "
                  + " | ".join(str(p["n_expressions"]) if p else "–" for p in probed) + " |")
    paper = PAPER_TABLE2.get((kind, threshold))
    if paper:
        for v in (v for v in learners if v in paper):  # the paper has rows for RM and CoT only
            md.append(f"| paper {learner_label(v)} (%) | " + " | ".join(f"{a:.1f}" for a in paper[v]) + " |")

    tex = [r"\begin{tabular}{@{}l*{%d}{c}!{\vrule}*{%d}{c}@{}}" % (n_iid, len(labels) - n_iid), r"\toprule",
           rf"\textbf{{{kind.capitalize()}}} & \multicolumn{{{n_iid}}}{{c}}{{\textbf{{IID}}}} & "
           rf"\multicolumn{{{len(labels) - n_iid}}}{{c}}{{\textbf{{OOD}}}} \\",
           rf"\textbf{{Bin ($\times {unit}$)}} & " + " & ".join(_tex_label(x) for x in labels) + r" \\",
           r"\midrule"]
    for v in learners:
        cells = ["n.f." if r["ood"] and v in unfit else f"${pct(a)}$" for r, a in zip(rows, acc[v])]
        tex.append(rf"\textbf{{{learner_label(v)} acc. (\%)}} & " + " & ".join(cells) + r" \\")
    if "rm" in acc and "cot" in acc:
        tex.append(r"\textbf{Gap (pt)} & " + " & ".join(f"${gap(a, b)}$" for a, b in zip(acc["rm"], acc["cot"]))
                   + r" \\")
    tex += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(md) + "\n", "\n".join(tex).replace("–", "--") + "\n"


def _tex_label(label: str) -> str:
    return "$" + label.replace("<=", r"\le").replace(">=", r"\ge").replace("-", "$--$") + "$"


def check_split_meta(split, where: str) -> None:
    """A split as experiment.json records it, checked for what the reports read: its `bins`, a
    non-empty list of objects each with a string `label`, a boolean `ood` and integer counts
    `available` and `sampled`; `t_max` an integer where present. Else a one-line DataError."""
    def count(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    bins = split.get("bins") if isinstance(split, dict) else None
    if not (isinstance(bins, list) and bins and all(
            isinstance(b, dict) and isinstance(b.get("label"), str) and isinstance(b.get("ood"), bool)
            and count(b.get("available")) and count(b.get("sampled")) for b in bins)):
        raise DataError(f"{where}: its bins should be a list of objects, each with a string 'label', "
                        "a boolean 'ood' and counts 'available' and 'sampled'")
    if len({b["label"] for b in bins}) != len(bins):
        raise DataError(f"{where}: two bins share a label")
    if split.get("t_max") is not None and not count(split["t_max"]):
        raise DataError(f"{where}: 't_max' should be a count of tokens, got {shorten(repr(split['t_max']))}")


# The fields of an evaluation's records the threshold tables and diagnostics are computed from.
THRESHOLD_FIELDS = ("bin", "ood", "within_tmax", "valid")


def threshold_results(out: Path, job: str, name: str) -> list[dict] | None:
    """A learner's evaluation on the binned set, refused when it lacks a field of
    `THRESHOLD_FIELDS` (its cells would read as not evaluated)."""
    results = eval_results(out, job, name, "eval")
    if results is not None:
        require_fields(results, THRESHOLD_FIELDS, str(results_file(find_eval_dir(run_path(out, job, name), "eval"))))
    return results


def report_threshold(out: Path, meta: dict, dest: Path, base: str) -> dict:
    """The tables and figures of the threshold job `base` (its seed-0 name): from its first seed
    with a folder (seed 0, or the lowest other of a folder run with `--seeds 1,2`), with the
    spread over seeds where there are several."""
    kind, threshold = meta["kind"], int(meta["threshold"])
    first = seed_indices(out, base)[0]
    job = seeded_job(base, first)
    results = {v: threshold_results(out, job, v) for v in learners(out, [job])}
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
    md += frame_width_section(rows, t_max)
    probed = {v: probe_rows(out, job, v, "eval") for v in names if v not in unfit}
    predictors = {v: f for v, p in probed.items() if p and (f := failure_predictors(results[v], p))}
    wrong = {v: w for v in names if v not in unfit and (w := wrong_trace_summary(results[v]))}
    md += wrong_trace_table(wrong, f"{'L' if kind == 'length' else 'K'} = {threshold}")
    md += failure_prediction_table(predictors)
    md += frame_error_sections(out, job, names, fits)
    spread = seed_spread(out, meta, base, names)
    if spread is not None or first != 0:
        md = md.replace(" acc. (%)", f", seed {first}, acc. (%)")
    if spread is not None:
        md += spread_tables(spread, meta["split"]["bins"], kind, threshold)
    (dest / f"table-{base}.md").write_text(md)
    (dest / f"table-{base}.tex").write_text(tex)
    plot_bins(dest / f"bins-{base}", kind, threshold, rows, names, unfit, spread)
    plot_learning_curves(dest / f"curves-{base}", runs)
    data = {"job": job, "rows": rows, "t_max": t_max, "best_validation": fits, "not_fitted": sorted(unfit),
            "failure_prediction": predictors, "wrong_ood": wrong}
    if spread is not None:
        data["seeds"] = spread
    return data


def seed_spread(out: Path, meta: dict, job: str, names: list[str]) -> dict | None:
    """Each learner's cells over its training seeds (`rlmlab.measuring.stats.seed_cell`), per bin, and
    the paired differences between learners, when some learner has evaluations of more than one
    seed; else None (a single-seed folder reports as it always has).

    A learner's out-of-domain cell stands only where every one of its seeds fitted; its
    per-seed values stand for the seeds that fitted."""
    seeds = seed_indices(out, job)
    by_learner: dict[str, dict[int, list[dict]]] = {}
    fits: dict[str, dict[int, float | None]] = {}
    for v in names:
        for s in seeds:
            res = threshold_results(out, seeded_job(job, s), v)
            if res is None:
                continue
            by_learner.setdefault(v, {})[s] = res
            runs = training_runs(out, seeded_job(job, s))
            fits.setdefault(v, {})[s] = training_summary(runs[v])["best"] if v in runs else None
    if not any(len(r) > 1 for r in by_learner.values()):
        return None
    labels = [b["label"] for b in meta["split"]["bins"]]
    ood = {b["label"]: b["ood"] for b in meta["split"]["bins"]}
    learners_out, matrices = {}, {}
    for v, per_seed in by_learner.items():
        fitted_seeds = [s for s, best in fits[v].items() if fitted(best)]
        cells = []
        for label in labels:
            in_bin = {s: [r for r in res if r.get("bin") == label] for s, res in per_seed.items()}
            if not all(in_bin.values()):
                cells.append(None)
                continue
            keep = [s for s in in_bin if not ood[label] or s in fitted_seeds]
            m = correctness([in_bin[s] for s in in_bin], f"{out / job} {v} bin {label}")
            matrices[(v, label)] = (m, len(keep) == len(in_bin))
            c = seed_cell(m) if len(keep) == len(in_bin) else {"seeds": len(in_bin), "n": m.shape[1], "mean": None}
            c["per_seed"] = {str(s): (float(row.mean()) if s in keep else None) for s, row in zip(in_bin, m)}
            cells.append(c)
        learners_out[v] = {"seeds": sorted(per_seed), "fitted_seeds": sorted(fitted_seeds),
                           "best_validation": {str(s): b for s, b in fits[v].items()}, "cells": cells}
    pairs = [(a, b) for a, b in _comparisons(list(by_learner))]
    paired_out = []
    for a, b in pairs:
        diffs = []
        for label in labels:
            ma, mb = matrices.get((a, label)), matrices.get((b, label))
            usable = ma is not None and mb is not None and ma[1] and mb[1]
            diffs.append(paired(ma[0], mb[0]) if usable else None)
        paired_out.append({"a": a, "b": b, "cells": diffs})
    return {"bins": labels, "learners": learners_out, "paired": paired_out}


def _comparisons(names: list[str]) -> list[tuple[str, str]]:
    """The pairs a report compares: RM with CoT, and each learner with another position encoding
    with the same learner's learned table."""
    pairs = [("rm", "cot")] if "rm" in names and "cot" in names else []
    for v in names:
        base = v.split("@")[0]
        if "@" in v and base in names:
            pairs.append((v, base))
    return pairs


def spread_tables(spread: dict, bins: list[dict], kind: str, threshold: int) -> str:
    """Markdown of `seed_spread`: per learner the mean over seeds, its interval and each seed's
    value; then the paired differences."""
    unit = "L" if kind == "length" else "K"
    n_iid = sum(not b["ood"] for b in bins)
    head = (f"| {kind.capitalize()} bin (×{unit}, {unit}={threshold}) | "
            + " | ".join(f"{b['label']}{' (IID)' if i < n_iid else ''}" for i, b in enumerate(bins)) + " |\n"
            + "|---" * (len(bins) + 1) + "|\n")

    def mean(c):
        return "–" if c is None else "not fitted" if c["mean"] is None else pct(c["mean"])

    def interval(c):
        return "–" if c is None or c["mean"] is None else f"{pct(c['ci95'][0])}–{pct(c['ci95'][1])}"

    def seeds_of(c):
        return "–" if c is None else " / ".join("n.f." if x is None else pct(x) for x in c["per_seed"].values())

    fits = "; ".join(f"{learner_label(v)}: seed{'s' if len(d['seeds']) > 1 else ''} "
                     f"{', '.join(map(str, d['seeds']))} ({len(d['fitted_seeds'])} of {len(d['seeds'])} fitted)"
                     for v, d in spread["learners"].items())
    md = ["\nOver training seeds: each learner's mean accuracy over its seeds (all scored on the same "
          "expressions), a 95% interval from a bootstrap that resamples seeds and expressions, and each "
          "seed's accuracy in seed order (n.f.: that seed did not fit). An out-of-domain mean stands only "
          f"where every seed fitted. {fits}.\n\n" + head.rstrip("\n")]
    for v, d in spread["learners"].items():
        md.append(f"| {learner_label(v)}: mean over seeds (%) | " + " | ".join(mean(c) for c in d["cells"]) + " |")
        md.append(f"| {learner_label(v)}: 95% interval | " + " | ".join(interval(c) for c in d["cells"]) + " |")
        md.append(f"| {learner_label(v)}: per seed (%) | " + " | ".join(seeds_of(c) for c in d["cells"]) + " |")
    if spread["paired"]:
        md.append("\nPaired differences (percentage points, first learner minus second; expressions resampled "
                  "together, each learner's seeds on their own; 95% interval; `>` or `<` where the interval "
                  "excludes zero):\n\n" + head.rstrip("\n"))
        for p in spread["paired"]:
            cells = ["–" if c is None else
                     f"{100 * c['diff']:+.1f} [{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}]"
                     + {"higher": " >", "lower": " <"}.get(c["verdict"], "") for c in p["cells"]]
            md.append(f"| {learner_label(p['a'])} − {learner_label(p['b'])} | " + " | ".join(cells) + " |")
    return "\n".join(md) + "\n"


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

    def check_meta(self, meta: dict, path: Path) -> None:
        super().check_meta(meta, path)
        check_split_meta(meta["split"], f"{path}: 'split'")

    def job_name(self, threshold: int, seed: int = 0) -> str:
        """Folder of the run at `threshold` with training seed index `seed`: seed 0 keeps the
        unsuffixed name that single-seed folders have always used (`length-595`), seed k adds
        `-s<k>` (`length-595-s1`)."""
        return seeded_job(f"{self.name}-{threshold}", seed)

    def identity(self, meta: dict) -> dict:
        return {**super().identity(meta), "threshold": meta.get("threshold")}

    def planned_identity(self, preset, task: Task, threshold: int | None = None, seeds: list[int] | None = None) -> dict:
        return {**super().planned_identity(preset, task), "threshold": self.threshold(preset, threshold)}

    def plan(self, preset: ExperimentPreset, out: Path, learners, progress: bool = True, *, task: Task,
             threshold: int | None = None, seeds: list[int] | None = None) -> list[Job]:
        """One job per learner and training seed index (default: seed 0 only). Every seed trains
        on the same split and is evaluated on the same expressions; the seed sets the model's
        initialisation and the order of the training data (`train.seed` = 1337 + index)."""
        from rlmlab.experiments.splits import Split, threshold_split, without_ood

        p = preset
        threshold = self.threshold(p, threshold)
        seeds = check_seeds(seeds)
        data = out / "data" / self.job_name(threshold)
        ensure_data(data, "split.json", lambda: threshold_split(
            load_pool(p, out, task, progress), self.name, threshold, n_val=p.n_val, per_bin_cap=p.per_bin_cap,
            n_train=p.n_train))
        split = Split.load(data, task)
        check_split(data, split.params, p, {"n_val": p.n_val, "per_bin_cap": p.per_bin_cap,
                                            "n_train_requested": p.n_train})
        if (why := without_ood(split.params)) is not None:
            print(f"{data}: warning: {why}", file=sys.stderr)
        write_meta(out, self, p, task, {"threshold": threshold, "split": split.params}, learners)
        return [Job(self.job_name(threshold, seed), v,
                    p.run_config(v, str(data / "train.parquet"), str(data / "val.parquet"), seed=seed),
                    {"eval": str(data / "eval.parquet")}, **p.eval_options)
                for seed in seeds for v in learners]

    def job_names(self, out: Path, meta: dict) -> list[str]:
        threshold = int(meta["threshold"])
        return [self.job_name(threshold, s) for s in seed_indices(out, self.job_name(threshold))]

    def report(self, out: Path, meta: dict, dest: Path) -> dict:
        return report_threshold(out, meta, dest, self.job_name(int(meta["threshold"])))

"""The threshold sweep (the paper's appendix "Threshold splits"): the length and depth splits at
several thresholds in one folder, one job per threshold and learner, with a figure of accuracy
against the threshold.

A sweep folder has the layout of the single-threshold experiments side by side: job
`length-595` trains on `data/length-595/` exactly as `rlmlab run length --threshold 595` does
(same split, same settings), so a finished single-threshold experiment of the same preset and
pool joins a sweep without retraining (`rlmlab export SINGLE SWEEP`, `absorb`).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from rlmlab.errors import ConfigError, DataError, NoResultsError
from rlmlab.experiments.folder import check_split, ensure_data, load_pool, read_experiment_json, write_meta
from rlmlab.experiments.job import Job
from rlmlab.experiments.kinds.base import ExperimentKind, meta_task_digest
from rlmlab.experiments.kinds.threshold import check_split_meta, report_threshold, threshold_results
from rlmlab.experiments.presets import ExperimentPreset
from rlmlab.experiments.seeds import check_seeds, seed_indices, seeded_job
from rlmlab.experiments.tables import (
    FIT_THRESHOLD,
    LEARNER_COLORS,
    fitted,
    learner_label,
    learners,
    pct,
    save_figures,
    training_runs,
)
from rlmlab.experiments.training_log import training_summary
from rlmlab.measuring.stats import accuracy

if TYPE_CHECKING:
    from rlmlab.task.taskfile import Task

SPLIT_KINDS = ("length", "depth")
UNIT = {"length": "L", "depth": "K"}

# What the runs of a sweep share, besides the kind: the model and the data every split is
# drawn from. Budgets may differ between thresholds (each run's config.json has its own).
SHARED_PRESET_FIELDS = ("model", "pool_n", "pool_seed", "per_bin_cap", "n_val", "n_train")


def shared(p: ExperimentPreset) -> dict:
    """What every run of a sweep shares (`SHARED_PRESET_FIELDS`), as experiment.json records it."""
    return {f: getattr(p, f) for f in SHARED_PRESET_FIELDS}


def job_name(kind: str, threshold: int) -> str:
    """The job (and data folder) of one threshold: the name the single-threshold experiment gives it."""
    return f"{kind}-{threshold}"


def parse_job(name: str) -> tuple[str, int]:
    """(kind, threshold) of a job name written by `job_name`."""
    kind, _, value = name.partition("-")
    if kind not in SPLIT_KINDS or not value.isdigit() or int(value) < 1:
        raise DataError(f"{name!r} is not a threshold job (length-L or depth-K)")
    return kind, int(value)


def ordered_jobs(names) -> list[str]:
    """Length thresholds first, then depth, each increasing."""
    return sorted(names, key=lambda n: (SPLIT_KINDS.index(parse_job(n)[0]), parse_job(n)[1]))


def sweep_points(out: Path, meta: dict) -> list[dict]:
    """Per (split, threshold, learner) with evaluation results: below-threshold accuracy (the
    held-out IID bins pooled), the accuracy of every out-of-domain bin (None where the learner
    did not fit: best validation below `FIT_THRESHOLD`), best validation and T_max."""
    points = []
    for base in ordered_jobs(meta["splits"]):
        kind, threshold = parse_job(base)
        split = meta["splits"][base]
        job = seeded_job(base, seed_indices(out, base)[0])  # as its threshold table: its first seed
        runs = training_runs(out, job)
        for name in learners(out, [job]):
            res = threshold_results(out, job, name)
            if res is None:
                continue
            best = training_summary(runs[name])["best"] if name in runs else None
            ok = fitted(best)
            ood = {}
            for b in split["bins"]:
                if not b["ood"]:
                    continue
                in_bin = [r for r in res if r.get("bin") == b["label"]]
                ood[b["label"]] = accuracy(in_bin) if in_bin and ok else None
            below = [r for r in res if r.get("ood") is False]
            points.append({"split": kind, "threshold": threshold, "job": job, "learner": name, "best_validation": best,
                           "fitted": ok, "t_max": split.get("t_max"), "n_train": split.get("n_train"),
                           "below": accuracy(below) if below else None, "ood": ood,
                           "n": {b["label"]: b["sampled"] for b in split["bins"]},
                           "beyond_table": beyond_table(res, name, runs.get(name))})
    return points


def beyond_table(results: list[dict], name: str, run_dir: Path | None) -> dict[str, int]:
    """Per bin, the expressions whose canonical trace needs a longer context than the learner's
    positional table: CoT reads the trace before its last token, RM the active frame before its
    last token. Such an expression cannot be answered, whatever the model learned. Empty for an
    encoding without a table (NoPE, RoPE, ALiBi), which has no such limit."""
    from rlmlab.learning.config import RUN_CONFIG_FILE, preset, read_run_config
    from rlmlab.learning.learner import get_learner

    if run_dir is None or not (run_dir / RUN_CONFIG_FILE).exists():
        return {}
    model = read_run_config(run_dir, DataError).model
    if model.positions != "learned":
        return {}
    try:
        block = model.block_size or preset(model.preset, name, 1).block_size
        driver = get_learner(name).driver
    except ConfigError:  # a learner this version does not know
        return {}
    column = {"cot": "trace_len", "rm": "max_frame_width"}.get(driver)
    counts: dict[str, int] = {}
    for r in results:
        if column is not None and isinstance(r.get(column), int) and r[column] - 1 > block:
            counts[r.get("bin")] = counts.get(r.get("bin"), 0) + 1
    return counts


def sweep_table(kind: str, points: list[dict]) -> str:
    """The compact Markdown table of one split's sweep: a row per threshold and learner."""
    points = [p for p in points if p["split"] == kind]
    if not points:
        return ""
    labels = list(points[0]["ood"])
    unit = UNIT[kind]
    md = [f"| {unit} | learner | training expr. | T_max | best val. (%) | below {unit} (%) | "
          + " | ".join(f"×{lab}" for lab in labels) + " |", "|---" * (6 + len(labels)) + "|"]
    last = None
    for p in points:
        if last is not None and last != p["threshold"]:
            md.append(_n_row(last, [q for q in points if q["threshold"] == last][0], labels))
        last = p["threshold"]
        cells = [("not fitted" if not p["fitted"] else "–") if p["ood"][lab] is None
                 else pct(p["ood"][lab]["accuracy"]) for lab in labels]
        md.append(f"| {p['threshold']} | {learner_label(p['learner'])} | {p['n_train']:,} | {p['t_max']} | "
                  f"{pct(p['best_validation'])} | {pct(p['below'] and p['below']['accuracy'])} | "
                  + " | ".join(cells) + " |")
    md.append(_n_row(last, [q for q in points if q["threshold"] == last][0], labels))
    notes = [f"- {unit} = {p['threshold']}, {learner_label(p['learner'])}: "
             + ", ".join(f"{k} of {p['n'][lab]} in ×{lab}" for lab, k in p["beyond_table"].items())
             for p in points if p["beyond_table"]]
    if notes:
        md += ["", "Expressions whose canonical trace needs a longer context than the learner's positional table "
               "(they cannot be answered whatever the model learned; counted in the cells above):", ""] + notes
    return "\n".join(md) + "\n"


def _n_row(threshold: int, p: dict, labels: list[str]) -> str:
    below = sum(n for lab, n in p["n"].items() if lab not in p["ood"])
    return (f"| {threshold} | n | | | | {below} | " + " | ".join(str(p["n"][lab]) for lab in labels) + " |")


def sweep_tex(kind: str, points: list[dict]) -> str:
    points = [p for p in points if p["split"] == kind]
    labels = list(points[0]["ood"])
    unit = UNIT[kind]
    tex = [r"\begin{tabular}{@{}rl*{%d}{c}@{}}" % (1 + len(labels)), r"\toprule",
           rf"${unit}$ & learner & below ${unit}$ & "
           + " & ".join(r"$\times " + lab.replace("<=", r"\le ").replace(">=", r"\ge ").replace("-", "$--$") + "$"
                        for lab in labels) + r" \\", r"\midrule"]
    for p in points:
        cells = [("n.f." if not p["fitted"] else "--") if p["ood"][lab] is None else pct(p["ood"][lab]["accuracy"])
                 for lab in labels]
        tex.append(f"{p['threshold']} & {learner_label(p['learner'])} & {pct(p['below'] and p['below']['accuracy'])} & "
                   + " & ".join(cells) + r" \\")
    tex += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(tex).replace("–", "--") + "\n"


LEARNER_STYLES = {"rm": ("-", "o"), "cot": ("--", "^")}
# Learners beyond the paper's two are often trained at one threshold only, where a line style
# cannot show: each gets a marker of its own, in order of appearance.
EXTRA_MARKERS = ("s", "D", "P", "X", "v", "*", "h")


def plot_sweep(path: Path, points: list[dict]) -> None:
    """Accuracy against the threshold, one panel per split present: below the threshold (the
    learner's colour, thick) and every out-of-domain bin (a colour per bin, from the nearest to
    the farthest), a line style per learner. A learner that did not fit at a threshold has no
    out-of-domain point there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    kinds = [k for k in SPLIT_KINDS if any(p["split"] == k for p in points)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.2 * len(kinds) + 2.2, 4.2), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, kind in zip(axes[0], kinds):
        ps = [p for p in points if p["split"] == kind]
        labels = list(ps[0]["ood"])
        names = list(dict.fromkeys(p["learner"] for p in ps))
        thresholds = sorted({p["threshold"] for p in ps})
        handles = []

        def series(cells: dict) -> list[float]:
            # NaN at a threshold without a cell breaks the line there: no value is drawn between
            # two thresholds that were measured around one that was not.
            return [100 * cells[t]["accuracy"] if cells.get(t) else float("nan") for t in thresholds]

        extra = [n for n in names if n not in LEARNER_STYLES]
        for i, name in enumerate(names):
            ls, marker = LEARNER_STYLES.get(name) or (":", EXTRA_MARKERS[extra.index(name) % len(EXTRA_MARKERS)])
            mine = [p for p in ps if p["learner"] == name]
            color = LEARNER_COLORS.get(name, f"C{i}")
            ax.plot(thresholds, series({p["threshold"]: p["below"] for p in mine}), ls=ls, marker=marker,
                    color=color, lw=2.4, ms=6)
            for j, lab in enumerate(labels):
                cells = {p["threshold"]: p["ood"][lab] for p in mine}
                if any(cells.values()):
                    ax.plot(thresholds, series(cells), ls=ls, marker=marker,
                            color=cmap(j / max(1, len(labels) - 1)), lw=1.2, ms=4, alpha=0.9)
            unfit = [p["threshold"] for p in mine if not p["fitted"]]
            handles.append(Line2D([], [], color="black", ls=ls, marker=marker,
                                  label=learner_label(name) + (f" (not fitted at {', '.join(map(str, unfit))})"
                                                              if unfit else "")))
        handles.append(Line2D([], [], color="grey", lw=2.4, label=f"below {UNIT[kind]} (learner's colour)"))
        handles += [Line2D([], [], color=cmap(j / max(1, len(labels) - 1)), lw=1.2, label=f"×{lab}")
                    for j, lab in enumerate(labels)]
        if kind == "length":
            ax.set_xscale("log")
        # Thresholds close on a log axis (1,060, 1,345, 1,839) would overprint level labels.
        ax.set_xticks(thresholds, [str(t) for t in thresholds], rotation=45 if kind == "length" else 0)
        ax.minorticks_off()
        ax.set_xlabel(f"{kind} threshold {UNIT[kind]}")
        ax.set_ylabel("final-answer accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.set_title(f"{kind} split: accuracy against the threshold")
        ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    save_figures(fig, path)


def report_sweep(out: Path, meta: dict, dest: Path) -> dict:
    per_job = []
    for job in ordered_jobs(meta["splits"]):
        kind, threshold = parse_job(job)
        if not learners(out, [seeded_job(job, seed_indices(out, job)[0])]):
            continue
        per_job.append(report_threshold(out, {"kind": kind, "threshold": threshold, "split": meta["splits"][job]},
                                        dest, job))
    if not per_job:
        raise NoResultsError(f"{out}: no evaluation results yet (run `rlmlab run sweep` first)")
    points = sweep_points(out, meta)
    md = ("Accuracy (%) against the threshold: below the threshold (its three held-out bins pooled) and per "
          "out-of-domain bin (multiple of the threshold). Out-of-domain cells only for learners whose best "
          f"validation final-answer accuracy reached {100 * FIT_THRESHOLD:.0f}%; per-threshold tables in "
          "table-<split>-<threshold>.md.\n")
    tex = ""
    for kind in SPLIT_KINDS:
        if any(p["split"] == kind for p in points):
            md += f"\n{kind.capitalize()} split:\n\n" + sweep_table(kind, points)
            tex += sweep_tex(kind, points)
    (dest / "table-sweep.md").write_text(md)
    (dest / "table-sweep.tex").write_text(tex)
    plot_sweep(dest / "sweep", points)
    return {"thresholds": per_job, "sweep": points}


class ThresholdSweep(ExperimentKind):
    """Length thresholds (`lengths`) and depth thresholds (`depths`) in one folder."""

    name = "sweep"
    options = ("lengths", "depths", "seeds")
    meta_fields = {"splits": dict, "shared": dict}

    def identity(self, meta: dict) -> dict:
        return {"kind": meta.get("kind"), "shared": meta.get("shared"), "task": meta_task_digest(meta)}

    def planned_identity(self, preset, task: Task, lengths=None, depths=None, seeds=None) -> dict:
        return {"kind": self.name, "shared": shared(preset), "task": task.digest}

    def plan(self, preset: ExperimentPreset, out: Path, learners, progress: bool = True, *, task: Task,
             lengths=None, depths=None, seeds=None) -> list[Job]:
        """Jobs for the thresholds asked for (default: the paper's 8 lengths and 5 depths) and the
        training seed indices `seeds` (default: seed 0; `rlmlab.experiments.seeds`). Runs on
        other thresholds, seeds or learners may share the folder: its experiment.json lists the
        split of every threshold any of them planned."""
        from rlmlab.experiments.splits import DEPTH_THRESHOLDS, LENGTH_THRESHOLDS, Split, threshold_split, without_ood

        p = preset
        seeds = check_seeds(seeds)
        if lengths is None and depths is None:
            lengths, depths = LENGTH_THRESHOLDS, DEPTH_THRESHOLDS
        for ts in (lengths, depths):
            if any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in ts or ()):
                raise ConfigError(f"thresholds must be positive integers, got {list(ts)!r}")
        wanted = [job_name(k, t) for k, ts in (("length", lengths), ("depth", depths)) for t in dict.fromkeys(ts or ())]
        asked = {"n_val": p.n_val, "per_bin_cap": p.per_bin_cap, "n_train_requested": p.n_train}
        splits = dict(read_experiment_json(out)["splits"]) if (out / "experiment.json").exists() else {}
        jobs = []
        pool = None

        def build(kind: str, threshold: int):
            nonlocal pool  # loaded once, by the first threshold whose split has to be built
            pool = pool if pool is not None else load_pool(p, out, task, progress)
            return threshold_split(pool, kind, threshold, n_val=p.n_val, per_bin_cap=p.per_bin_cap, n_train=p.n_train)

        for name in wanted:
            kind, threshold = parse_job(name)
            data = out / "data" / name
            ensure_data(data, "split.json", partial(build, kind, threshold), expected=splits.get(name))
            split = Split.load(data, task)
            check_split(data, split.params, p, asked)
            if (why := without_ood(split.params)) is not None:
                print(f"{data}: warning: {why}", file=sys.stderr)
            splits[name] = split.params
            jobs += [Job(seeded_job(name, seed), v,
                         p.run_config(v, str(data / "train.parquet"), str(data / "val.parquet"), seed=seed),
                         {"eval": str(data / "eval.parquet")}, **p.eval_options)
                     for seed in seeds for v in learners]
        write_meta(out, self, p, task, {"shared": shared(p), "splits": dict(sorted(splits.items()))}, learners)
        return jobs

    def job_names(self, out: Path, meta: dict) -> list[str]:
        return [seeded_job(job, s) for job in ordered_jobs(meta["splits"]) for s in seed_indices(out, job)]

    def report(self, out: Path, meta: dict, dest: Path) -> dict:
        return report_sweep(out, meta, dest)

    def check_meta(self, meta: dict, path: Path) -> None:
        super().check_meta(meta, path)
        for name, split in meta["splits"].items():
            try:
                parse_job(name)
            except DataError:
                raise DataError(f"{path}: {name!r} is not a threshold split (length-L or depth-K)") from None
            check_split_meta(split, f"{path}: the split {name}")

    def merge_meta(self, old: dict, new: dict) -> dict:
        for name in set(old["splits"]) & set(new["splits"]):
            if old["splits"][name] != new["splits"][name]:
                raise DataError(f"the split {name} differs between the two sweeps (another pool or other sizes)")
        return {**new, "splits": dict(sorted({**old["splits"], **new["splits"]}.items()))}

    def absorb(self, meta: dict) -> dict | None:
        """A single-threshold experiment's description as a sweep holding its one split, so that
        its results join a sweep folder (`rlmlab export SINGLE SWEEP`)."""
        if meta.get("kind") not in SPLIT_KINDS:
            return None
        preset = meta.get("preset") or {}
        task = {"task": meta["task"]} if "task" in meta else {}
        return {"kind": self.name, "preset": preset, **task,
                "shared": {f: preset.get(f) for f in SHARED_PRESET_FIELDS}, "splits": {job_name(meta["kind"], int(meta["threshold"])): meta["split"]}}

    def absorb_command(self, line: str, meta: dict) -> str:
        """A stored `rlmlab run length|depth` command line of an absorbed experiment (`meta`) as
        the `rlmlab run sweep` command that trains the same job; the original is kept beside it
        under "imported", the runs it planned under "runs" as they were."""
        import json

        try:
            stored = json.loads(line)
            argv = stored["argv"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return line
        if not (isinstance(argv, list) and argv[:2] == ["rlmlab", "run"] and len(argv) > 2
                and argv[2] in SPLIT_KINDS):
            return line
        kind, threshold = argv[2], meta["threshold"]
        new, skip = ["rlmlab", "run", "sweep"], False
        for i, a in enumerate(argv[3:], 3):
            if skip:
                skip = False
            elif a == "--threshold":
                skip, threshold = True, argv[i + 1] if i + 1 < len(argv) else threshold
            elif a.startswith("--threshold="):
                threshold = a.split("=", 1)[1]
            else:
                new.append(a)
        new.append(f"--{'lengths' if kind == 'length' else 'depths'}={threshold}")
        runs = {"runs": stored["runs"]} if "runs" in stored else {}  # the same run folders in the sweep
        return json.dumps({"argv": new, "imported": argv, **runs})

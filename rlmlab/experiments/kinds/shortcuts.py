"""The planted shortcuts (the paper's Table 3): both learners on each construction's training
set, tested in domain and where the planted signal stops agreeing with the answer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlmlab.errors import ConfigError, NoResultsError
from rlmlab.experiments.folder import check_saved, ensure_data, write_meta
from rlmlab.experiments.job import Job
from rlmlab.experiments.kinds.base import ExperimentKind
from rlmlab.experiments.presets import ExperimentPreset
from rlmlab.experiments.seeds import check_seeds, seed_indices, seeded_job
from rlmlab.experiments.tables import (
    FIT_THRESHOLD,
    count_ci,
    eval_results,
    fitted,
    gap,
    learner_label,
    learners,
    pct,
    probe_groups,
    training_runs,
)
from rlmlab.experiments.training_log import plot_learning_curves
from rlmlab.learning.learner import PAPER_LEARNERS
from rlmlab.measuring.stats import accuracy, correctness, seed_cell, share
from rlmlab.shortcuts.metric import shortcut_rate

if TYPE_CHECKING:
    from rlmlab.task.taskfile import Task


# The paper's Table 3: IID RM, IID CoT, OOD RM, OOD CoT accuracy and CoT shortcut rate (%).
PAPER_TABLE3 = {
    "copy_deep_return": (100.0, 100.0, 87.3, 7.0, 92.7),
    "hidden_literal": (90.3, 99.7, 86.0, 0.3, 99.3),
    "long_range_aggregate": (99.7, 100.0, 95.7, 10.3, 88.0),
    "near_answer_aggregate": (100.0, 100.0, 99.7, 1.0, 79.7),
    "position_weighted_aggregate": (100.0, 100.0, 97.0, 14.7, 69.7),
    "position_parity": (100.0, 100.0, 99.7, 9.7, 90.3),
}

# The paper's names of the constructions, as its Table 3 rows read.
PAPER_NAMES = {
    "copy_deep_return": "copy answer from deep return",
    "hidden_literal": "hidden intermediate literal",
    "long_range_aggregate": "long-range aggregate",
    "near_answer_aggregate": "near-answer aggregate",
    "position_weighted_aggregate": "position-weighted aggregate",
    "position_parity": "trace-position parity",
}


def report_shortcuts(kind: "ShortcutSuite", out: Path, meta: dict, dest: Path) -> dict:
    rows = []
    present = learners(out, kind.job_names(out, meta))
    for name in meta["constructions"]:
        job = kind.first_job(out, name)
        row = {"construction": name}
        for v in present:
            iid, ood = eval_results(out, job, v, "iid"), eval_results(out, job, v, "ood")
            if iid is not None:
                row[f"{v}_iid"] = accuracy(iid)
            if ood is not None:
                row[f"{v}_ood"] = accuracy(ood)
                row[f"{v}_shortcut_rate"] = shortcut_rate(ood)
                row[f"{v}_ood_valid"] = sum(bool(r.get("valid")) for r in ood) / len(ood)
            for set_name in ("iid", "ood"):
                probed = probe_groups(out, job, v, set_name)
                if probed:
                    row[f"{v}_probe_{set_name}"] = probed[0]
        rows.append(row)
    if not any(len(r) > 1 for r in rows):
        raise NoResultsError(f"{out}: no shortcut results yet (run `rlmlab run shortcuts` first)")

    def acc(r, key):
        return r[key]["accuracy"] if key in r else None

    # One column per probed learner: the theorem's quantity, non-invariant prediction points,
    # on the training distribution (IID) and where S stops agreeing with the answer (OOD).
    # Table 3 proper stays the paper's two learners; others get table-shortcuts-learners.md.
    probed = [v for v in present if any(f"{v}_probe_{s}" in r for r in rows for s in ("iid", "ood"))]
    paper_probed = [v for v in probed if v in PAPER_LEARNERS]
    probe_cols = [f"Non-invariant positions IID / OOD, {learner_label(v)} (%)" for v in paper_probed]

    def unfit(r):  # the paper's reading needs a learner that fits its training distribution
        names = [learner_label(v) for v in PAPER_LEARNERS if f"{v}_iid" in r and not fitted(acc(r, f"{v}_iid"))]
        # A learner without a run here (still training, or never asked for) is named, so that
        # its dashes are not read as a learner that fitted.
        absent = [learner_label(v) for v in PAPER_LEARNERS if f"{v}_iid" not in r]
        return "; ".join(filter(None, [", ".join(names), absent and "no run: " + ", ".join(absent)])) or "–"

    md = ["| Construction | IID RM acc. | IID CoT acc. | OOD RM acc. | OOD CoT acc. | Gap (pt) | Shortcut rate (CoT) "
          f"| Shortcut rate (RM) | Not fitted (IID < {100 * FIT_THRESHOLD:.0f}%) "
          "| paper (IID RM/CoT, OOD RM/CoT, rate) |" + "".join(f" {c} |" for c in probe_cols),
          "|---" * (10 + len(probe_cols)) + "|"]
    tex = [r"\begin{tabular}{@{}lcc!{\vrule}cccc@{}}", r"\toprule",
           r"Construction & RM acc. & CoT acc. & RM acc. & CoT acc. & Gap (pt) & Shortcut rate \\", r"\midrule"]
    for r in rows:
        p = PAPER_TABLE3.get(r["construction"])
        cells = [pct(acc(r, "rm_iid")), pct(acc(r, "cot_iid")), pct(acc(r, "rm_ood")), pct(acc(r, "cot_ood")),
                 gap(acc(r, "rm_ood"), acc(r, "cot_ood")), pct(r.get("cot_shortcut_rate"))]
        md.append(f"| {r['construction']} | " + " | ".join(cells) + f" | {pct(r.get('rm_shortcut_rate'))} | "
                  + f"{unfit(r)} | " + ("–" if p is None else " / ".join(f"{x:.1f}" for x in p)) + " |"
                  + "".join(f" {probe_cell(r, v)} |" for v in paper_probed))
        tex.append(r["construction"].replace("_", r"\_") + " & " + " & ".join(cells) + r" \\")
    tex += [r"\bottomrule", r"\end{tabular}"]
    md += ["", "Final-answer accuracy and shortcut rate (OOD answers equal to S) with 95% Wilson intervals; "
           "well-formed: OOD traces that end in an answer:", "",
           "| Construction | Learner | IID correct / n | OOD correct / n | OOD answers = S | OOD well-formed (%) |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        for v in present:
            if f"{v}_iid" not in r and f"{v}_ood" not in r:
                continue
            ood = r.get(f"{v}_ood")
            follow = None if ood is None else share(round(r[f"{v}_shortcut_rate"] * ood["n"]), ood["n"])
            md.append(f"| {r['construction']} | {labelled(r, v)} | {count_ci(r.get(f'{v}_iid'))} | "
                      f"{count_ci(ood)} | {count_ci(follow)} | {pct(r.get(f'{v}_ood_valid'))} |")
    for name in meta["constructions"]:
        plot_learning_curves(dest / f"curves-{kind.job_name(name)}", training_runs(out, kind.first_job(out, name)))
    (dest / "table-shortcuts.md").write_text("\n".join(md) + "\n")
    preset = meta.get("preset", {}).get("name", "?")
    (dest / "table-shortcuts-paper.md").write_text(paper_side_by_side(rows, preset, acc, unfit))
    if probed:
        (dest / "table-shortcuts-probe.md").write_text(shortcut_probe_table(rows, probed))
    if set(present) - set(PAPER_LEARNERS):
        (dest / "table-shortcuts-learners.md").write_text(shortcut_learner_table(rows, present))
    (dest / "table-shortcuts.tex").write_text("\n".join(tex).replace("–", "--") + "\n")
    spread = []
    for name in meta["constructions"]:
        jobs = {s: seeded_job(kind.job_name(name), s) for s in seed_indices(out, kind.job_name(name))}
        if len(jobs) < 2:  # a single-seed construction (every committed one) reads nothing more
            continue
        for v in present:
            per_seed = {s: (eval_results(out, job, v, "iid"), eval_results(out, job, v, "ood"))
                        for s, job in jobs.items()}
            if (c := seed_cells(name, v, per_seed)) is not None:
                spread.append(c)
    if spread:
        (dest / "table-shortcuts-seeds.md").write_text(shortcut_seeds_table(spread))
        return {"rows": rows, "seeds": spread}
    return {"rows": rows}


def seed_cells(construction: str, v: str,
               per_seed: dict[int, tuple[list[dict] | None, list[dict] | None]]) -> dict | None:
    """One learner on one construction over its training seeds (`rlmlab.measuring.stats.seed_cell`):
    IID accuracy, and OOD accuracy and shortcut rate where every seed fitted (IID >= 99%, Table
    3's rule); None unless at least two seeds were evaluated on both sets."""
    done = {s: sets for s, sets in sorted(per_seed.items()) if sets[0] is not None and sets[1] is not None}
    if len(done) < 2:
        return None
    where = f"{construction} {v}"
    iid = correctness([done[s][0] for s in done], f"{where} IID")
    ood = correctness([done[s][1] for s in done], f"{where} OOD")
    follows = correctness([[{"expr": r["expr"], "correct": shortcut_rate([r]) == 1.0} for r in done[s][1]]
                           for s in done], f"{where} OOD")
    fit = [s for s, row in zip(done, iid) if fitted(float(row.mean()))]
    every = len(fit) == len(done)
    return {"construction": construction, "learner": v, "seeds": list(done), "fitted_seeds": fit,
            "iid": seed_cell(iid), "ood": seed_cell(ood) if every else None,
            "shortcut_rate": seed_cell(follows) if every else None}


def shortcut_seeds_table(cells: list[dict]) -> str:
    """Markdown of `seed_cells`: mean over seeds, its 95% interval over seeds and expressions, and
    each seed's value."""

    def show(c):
        if c is None:
            return "not fitted", "–"
        return (f"{pct(c['mean'])} [{pct(c['ci95'][0])}, {pct(c['ci95'][1])}]",
                " / ".join(pct(x) for x in c["per_seed"]))

    md = ["Over training seeds (every seed scored on the same expressions): mean, 95% interval from a bootstrap "
          "that resamples seeds and expressions, and each seed's value in seed order. Out-of-domain cells stand "
          f"only where every seed fitted (IID >= {100 * FIT_THRESHOLD:.0f}%).", "",
          "| Construction | Learner | seeds (fitted) | IID acc. (%) | IID per seed | OOD acc. (%) | OOD per seed "
          "| Shortcut rate (%) | Shortcut rate per seed |", "|---" * 9 + "|"]
    for c in cells:
        seeds = f"{', '.join(map(str, c['seeds']))} ({len(c['fitted_seeds'])} of {len(c['seeds'])})"
        cols = [x for key in ("iid", "ood", "shortcut_rate") for x in show(c[key])]
        md.append(f"| {c['construction']} | {learner_label(c['learner'])} | {seeds} | " + " | ".join(cols) + " |")
    return "\n".join(md) + "\n"


def labelled(r: dict, v: str) -> str:
    """A learner's table label on a construction, marked when it did not fit (IID < 99%): the
    rows that show its out-of-domain numbers carry the mark."""
    iid = r.get(f"{v}_iid")
    return learner_label(v) + ("" if iid is None or fitted(iid["accuracy"]) else ", not fitted")


def probe_cell(r: dict, v: str) -> str:
    """A learner's non-invariant prediction points on a construction, "IID / OOD" (%)."""
    return " / ".join(pct(r.get(f"{v}_probe_{s}", {}).get("position_rate")) for s in ("iid", "ood"))


def paper_side_by_side(rows: list[dict], preset: str, acc, unfit) -> str:
    """Table 3 in the paper's row names and order, each learner pair beside the paper's, with
    CoT's non-invariant prediction points and the learners that did not fit (the README's table)."""
    md = [f"| Construction, {preset} | IID RM / CoT (%) | OOD RM / CoT (%) | shortcut rate RM / CoT (%) | "
          f"CoT non-invariant points IID / OOD (%) | paper IID RM / CoT | paper OOD RM / CoT | "
          f"paper CoT shortcut rate | not fitted (IID < {100 * FIT_THRESHOLD:.0f}%) |", "|---" * 9 + "|"]
    for r in sorted(rows, key=lambda r: PAPER_NAMES.get(r["construction"], r["construction"])):
        if len(r) == 1:  # nothing evaluated yet
            continue
        p = [f"{x:.1f}" for x in PAPER_TABLE3[r["construction"]]] if r["construction"] in PAPER_TABLE3 else ["–"] * 5
        probe = probe_cell(r, "cot")
        md.append(f"| {PAPER_NAMES.get(r['construction'], r['construction'])} | "
                  f"{pct(acc(r, 'rm_iid'))} / {pct(acc(r, 'cot_iid'))} | {pct(acc(r, 'rm_ood'))} / {pct(acc(r, 'cot_ood'))} | "
                  f"{pct(r.get('rm_shortcut_rate'))} / {pct(r.get('cot_shortcut_rate'))} | "
                  f"{'–' if probe == '– / –' else probe} | {p[0]} / {p[1]} | {p[2]} / {p[3]} | {p[4]} | {unfit(r)} |")
    return "\n".join(md) + "\n"


def shortcut_learner_table(rows: list[dict], present: list[str]) -> str:
    """Table 3 with one row per learner, on the constructions where learners beyond the paper's
    two were trained (another position encoding or observation): does the shortcut depend on
    what they change? Out-of-domain cells only for learners that fit (IID >= 99%)."""
    md = ["| Construction, by learner | Learner | IID acc. (%) | OOD acc. (%) | Shortcut rate (%) | OOD well-formed (%) "
          "| Non-invariant positions IID / OOD (%) |", "|---" * 7 + "|"]
    for r in rows:
        ran = [v for v in present if f"{v}_iid" in r]
        if not set(ran) - set(PAPER_LEARNERS):
            continue
        for v in ran:
            iid = r[f"{v}_iid"]["accuracy"]
            ood = [pct(r[f"{v}_ood"]["accuracy"]), pct(r.get(f"{v}_shortcut_rate")), pct(r.get(f"{v}_ood_valid"))] \
                if f"{v}_ood" in r else ["–"] * 3
            if not fitted(iid):
                ood = ["not fitted"] * 3
            probe = probe_cell(r, v)
            md.append(f"| {r['construction']} | {learner_label(v)} | {pct(iid)} | " + " | ".join(ood)
                      + f" | {'–' if probe == '– / –' else probe} |")
    return "\n".join(md) + "\n"


def shortcut_probe_table(rows: list[dict], learners: list[str]) -> str:
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
        for v in learners:
            for s in ("iid", "ood"):
                p = r.get(f"{v}_probe_{s}")
                if p is None:
                    continue
                acc = r.get(f"{v}_{s}", {}).get("accuracy")
                rate = r.get(f"{v}_shortcut_rate") if s == "ood" else None
                md.append(f"| {r['construction']} | {labelled(r, v)} | {s.upper()} | {p['n_expressions']} | "
                          f"{ci(p, 'position')} | {ci(p, 'witness')} | {ci(p, 'answer')} | "
                          f"{p.get('subproblems', '–')} | "
                          f"{pct(acc)} | {pct(rate)} |")
    return "\n".join(md) + "\n"


class ShortcutSuite(ExperimentKind):
    name = "shortcuts"
    options = ("constructions", "seeds")
    meta_fields = {"constructions": list}

    def job_name(self, construction: str) -> str:
        return f"shortcut-{construction}"

    def plan(self, preset: ExperimentPreset, out: Path, learners, progress: bool = True, *, task: Task,
             constructions=None, seeds=None) -> list[Job]:
        """Jobs of `constructions` (default: the paper's six) and training seed indices `seeds` (default:
        seed 0; a seed k > 0 trains in `shortcut-<construction>-s<k>/`). Runs on subsets share the
        folder: the experiment lists every construction any of them planned, in the table's order."""
        import pyarrow.parquet as pq

        from rlmlab.shortcuts import (
            CONSTRUCTIONS,
            EXPERIMENT_CONSTRUCTIONS,
            ShortcutConfig,
            ShortcutDataset,
            build_shortcut_dataset,
        )

        p = preset
        seeds = check_seeds(seeds)
        if not task.is_paper:
            raise ConfigError(f"the shortcut constructions are written in the paper's functions and mod-10 "
                              f"arithmetic; they do not run on {task.describe()}")
        names = list(constructions or CONSTRUCTIONS)
        unknown = [n for n in names if n not in EXPERIMENT_CONSTRUCTIONS]
        if unknown:
            raise ConfigError(f"unknown shortcut construction {unknown[0]!r} "
                              f"(have: {', '.join(EXPERIMENT_CONSTRUCTIONS)})")
        planned = set(names) | self.planned_before(out, "constructions")
        write_meta(out, self, p, task, {"constructions": [n for n in EXPERIMENT_CONSTRUCTIONS if n in planned]}, learners)
        config = ShortcutConfig(max_trace_len=p.shortcut_max_trace)
        jobs = []
        for name in names:
            data = out / "data" / self.job_name(name)
            ensure_data(data, "shortcut.json", lambda: build_shortcut_dataset(
                name, n_train=p.shortcut_n_train, n_val=min(p.n_val, 300), n_iid=p.shortcut_n_eval,
                n_ood=p.shortcut_n_eval, config=config, progress=progress), identity=ShortcutDataset.identity)
            ds = ShortcutDataset.load(data)
            saved = {**ds.params, "max_trace_len": (ds.params.get("config") or {}).get("max_trace_len")}
            check_saved(data, saved, {"n_train": p.shortcut_n_train, "n_val": min(p.n_val, 300),
                                       "n_iid": p.shortcut_n_eval, "n_ood": p.shortcut_n_eval,
                                       "max_trace_len": p.shortcut_max_trace})
            for part in ("iid", "ood"):
                if not (data / f"{part}.parquet").exists():
                    pq.write_table(getattr(ds, part), data / f"{part}.parquet")
            for seed in seeds:
                for v in learners:
                    config = p.run_config(v, str(data / "train.parquet"), str(data / "val.parquet"), seed=seed,
                                          stage="shortcut")
                    jobs.append(Job(seeded_job(self.job_name(name), seed), v, config,
                                    {"iid": str(data / "iid.parquet"), "ood": str(data / "ood.parquet")},
                                    **p.eval_options))
        return jobs

    def first_job(self, out: Path, name: str) -> str:
        """The job a construction's tables read: its seed 0, or its lowest seed of a folder run
        with `--seeds 1,2`."""
        return seeded_job(self.job_name(name), seed_indices(out, self.job_name(name))[0])

    def job_names(self, out: Path, meta: dict) -> list[str]:
        """Every construction's job folders, seed 0 first (Table 3 reads seed 0's)."""
        return [seeded_job(self.job_name(name), s) for name in meta["constructions"]
                for s in seed_indices(out, self.job_name(name))]

    def report(self, out: Path, meta: dict, dest: Path) -> dict:
        return report_shortcuts(self, out, meta, dest)

    def merge_meta(self, old: dict, new: dict) -> dict:
        from rlmlab.shortcuts import EXPERIMENT_CONSTRUCTIONS

        either = set(old["constructions"]) | set(new["constructions"])
        known = EXPERIMENT_CONSTRUCTIONS
        return {**new, "constructions": [c for c in known if c in either] + sorted(either - set(known))}

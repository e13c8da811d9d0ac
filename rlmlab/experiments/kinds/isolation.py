"""Isolation or indexing: the 2×2 that separates the two things RM changes, read from sibling
experiment folders.

RM differs from CoT in what it sees (the active frame, not the whole trace) and in where its
positions count from (the frame's start, not the trace's). `model.position_index` varies the
second alone (docs/positions.md), so four cells of one split answer how much of RM's lead each
factor carries:

| | positions from the trace's start | from the active frame's start |
|---|---|---|
| sees the whole trace | CoT | CoT, `position_index=frame` |
| sees the active frame | RM, `position_index=trace` | RM |

Its folder trains nothing: `experiment.json` names member folders beside it (as a `scale`
comparison does), each `rlmlab run length|depth` at the same threshold on the same evaluation
expressions:

    {"kind": "isolation", "split_kind": "length", "threshold": 595,
     "members": ["../length-595-paper-cpu-steps", "../length-595-isolation-paper-cpu-steps"]}

Every run of every member is placed by its own config: what it sees (its learner's
observation), where its positions count from, its encoding and start offsets. The four cells
are the learned-table runs without offsets; the other runs (RoPE, offsets) are listed beside
them. The report tabulates each cell per bin over its fitted seeds, the four paired effects
(each resamples the shared expressions and each cell's own seeds, `rlmlab.measuring.stats.paired`), and draws
the 2×2 just past the threshold and in the last bin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlmlab.attention.encodings import POSITION_LABELS
from rlmlab.attention.position_index import OWN_INDEX
from rlmlab.errors import DataError, NoResultsError
from rlmlab.experiments.folder import read_experiment_json
from rlmlab.experiments.kinds.scale import SplitComparison, member_folders
from rlmlab.experiments.seeds import seed_indices, seeded_job
from rlmlab.experiments.tables import eval_results, fitted, pct, save_figures, training_runs
from rlmlab.experiments.training_log import training_summary
from rlmlab.learning.config import RunConfig, read_run_config
from rlmlab.learning.learner import get_learner
from rlmlab.measuring.stats import correctness, paired, seed_cell

SEES = {"cot": "whole trace", "rm": "active frame"}
COUNTS = {"trace": "trace start", "frame": "frame start"}
CELLS = [("cot", "trace"), ("cot", "frame"), ("rm", "trace"), ("rm", "frame")]
"""The 2×2, as (what the learner sees, where its positions count from)."""
EFFECTS = [
    ("isolation, positions from the frame", ("rm", "frame"), ("cot", "frame")),
    ("isolation, positions from the trace", ("rm", "trace"), ("cot", "trace")),
    ("indexing, seeing the whole trace", ("cot", "frame"), ("cot", "trace")),
    ("indexing, seeing the active frame", ("rm", "frame"), ("rm", "trace")),
]
"""Each factor's effect at each level of the other: the first cell minus the second, paired."""


def run_variant(learner: str, cfg: RunConfig) -> dict:
    """What a run's config makes of its learner: what it sees, where its positions count from,
    its encoding and its largest start offset."""
    obs = get_learner(learner).observation.name
    if obs not in SEES:
        raise DataError(f"{learner}: a 2×2 of isolation reads CoT and RM runs only")
    return {"sees": obs, "counts": cfg.model.position_index or OWN_INDEX[obs], "encoding": cfg.model.positions,
            "offset": cfg.train.start_offset}


def variant_label(v: dict) -> str:
    text = f"{'CoT' if v['sees'] == 'cot' else 'RM'}, sees the {SEES[v['sees']]}, positions from the {COUNTS[v['counts']]}"
    if v["encoding"] != "learned":
        text += f", {POSITION_LABELS[v['encoding']]}"
    if v["offset"]:
        text += f", start offsets up to {v['offset']:,}"
    return text


def collect(members: list[Path], kind: str, threshold: int) -> tuple[list[dict], list[dict]]:
    """Every (member, learner) run set, with its variant, per-seed results and fitted seeds; and
    the bins of the split (checked the same in every member)."""
    job = f"{kind}-{threshold}"
    bins = None
    groups = []
    for member in members:
        member_bins = read_experiment_json(member)["split"]["bins"]
        if bins is None:
            bins = member_bins
        elif [b["label"] for b in member_bins] != [b["label"] for b in bins]:
            raise DataError(f"{member}: its bins differ from {members[0]}'s")
        seeds = seed_indices(member, job)
        by_learner: dict[str, dict] = {}
        for s in seeds:
            for name, run in training_runs(member, seeded_job(job, s)).items():
                res = eval_results(member, seeded_job(job, s), name, "eval")
                if res is None:
                    continue
                variant = run_variant(name, read_run_config(run, DataError))
                g = by_learner.setdefault(name, {"member": member.name, "learner": name, "variant": variant,
                                                 "results": {}, "best": {}})
                if g["variant"] != variant:
                    raise DataError(f"{member}: the seeds of {name} trained different variants; compare them apart")
                g["results"][s] = res
                g["best"][s] = training_summary(run)["best"]
        groups.extend(by_learner.values())
    return groups, bins or []


def bin_matrix(group: dict, label: str, ood: bool) -> np.ndarray | None:
    """Seeds × expressions 0/1 of one bin: every seed in domain, the fitted seeds out of it (None
    when none fitted)."""
    chosen = [res for s, res in sorted(group["results"].items()) if not ood or fitted(group["best"][s])]
    if not chosen:
        return None
    try:
        return correctness([[r for r in res if r.get("bin") == label] for res in chosen],
                           f"{group['member']} {group['learner']} bin {label}")
    except ValueError as e:
        raise DataError(str(e)) from None


def same_expressions(a: dict, b: dict, label: str) -> bool:
    ea = [r["expr"] for r in next(iter(a["results"].values())) if r.get("bin") == label]
    eb = [r["expr"] for r in next(iter(b["results"].values())) if r.get("bin") == label]
    return ea == eb


def isolation_report(groups: list[dict], bins: list[dict]) -> dict:
    cells = {}
    for g in groups:
        v = g["variant"]
        if v["encoding"] == "learned" and not v["offset"]:
            key = (v["sees"], v["counts"])
            if key in cells:
                raise DataError(f"{g['member']} and {cells[key]['member']} both hold the cell "
                                f"{variant_label(v)}; a 2×2 takes one folder per cell")
            cells[key] = g
    rows = []
    for g in groups:
        per_bin = {}
        for b in bins:
            m = bin_matrix(g, b["label"], b["ood"])
            per_bin[b["label"]] = None if m is None or not m.size else seed_cell(m)
        rows.append({"member": g["member"], "learner": g["learner"], "variant": g["variant"],
                     "seeds": sorted(g["results"]), "fitted_seeds": sorted(s for s, b in g["best"].items() if fitted(b)),
                     "bins": per_bin})
    effects = []
    for name, a_key, b_key in EFFECTS:
        a, b = cells.get(a_key), cells.get(b_key)
        if a is None or b is None:
            continue
        per_bin = {}
        for bn in bins:
            ma, mb = bin_matrix(a, bn["label"], bn["ood"]), bin_matrix(b, bn["label"], bn["ood"])
            if ma is None or mb is None or not ma.size:
                per_bin[bn["label"]] = None
                continue
            if not same_expressions(a, b, bn["label"]):
                raise DataError(f"{a['member']} and {b['member']}: bin {bn['label']} holds other expressions; "
                                "a paired effect needs the same evaluation set")
            per_bin[bn["label"]] = paired(ma, mb)
        effects.append({"effect": name, "a": list(a_key), "b": list(b_key), "bins": per_bin})
    return {"bins": bins, "rows": rows, "effects": effects}


def _cell_text(c: dict | None) -> str:
    if c is None:
        return "not fitted"
    return pct(c["mean"]) + (f" ({pct(c['min'])}–{pct(c['max'])})" if c["seeds"] > 1 else "")


def _effect_text(e: dict | None) -> str:
    if e is None:
        return "–"
    lo, hi = e["ci95"]
    return f"{100 * e['diff']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def isolation_tables(report: dict, kind: str, threshold: int) -> str:
    unit = "L" if kind == "length" else "K"
    labels = [b["label"] for b in report["bins"]]
    head = ["run", "folder", "seeds fitted"] + [f"{x}×{unit}" for x in labels]
    md = [f"Isolation or indexing, {kind} split at {unit} = {threshold}: final-answer accuracy (%) per bin, mean "
          "over training seeds (their range); out of domain over the seeds that reached 99% validation "
          "(\"not fitted\" where none did).\n",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {key: i for i, key in enumerate(CELLS)}
    for r in sorted(report["rows"], key=lambda r: (r["variant"]["encoding"] != "learned" or bool(r["variant"]["offset"]),
                                                   order[(r["variant"]["sees"], r["variant"]["counts"])],
                                                   r["variant"]["encoding"], r["variant"]["offset"])):
        md.append("| " + " | ".join([variant_label(r["variant"]), r["member"],
                                    f"{len(r['fitted_seeds'])} of {len(r['seeds'])}"]
                                   + [_cell_text(r["bins"][x]) for x in labels]) + " |")
    if report["effects"]:
        md += ["", "Each factor's effect, at each level of the other (percentage points, first cell minus second, "
               "paired on the same expressions; 95% interval resampling the expressions and each cell's seeds):\n",
               "| effect | cells | " + " | ".join(f"{x}×{unit}" for x in labels) + " |",
               "|" + "---|" * (len(labels) + 2)]
        for e in report["effects"]:
            cells = (f"{'CoT' if e['a'][0] == 'cot' else 'RM'} from the {e['a'][1]} − "
                     f"{'CoT' if e['b'][0] == 'cot' else 'RM'} from the {e['b'][1]}")
            md.append(f"| {e['effect']} | {cells} | " + " | ".join(_effect_text(e["bins"][x]) for x in labels) + " |")
    return "\n".join(md) + "\n"


def plot_isolation(path: Path, report: dict, kind: str, threshold: int) -> None:
    """The 2×2 just past the threshold and in the last bin: each cell's mean, its seeds' range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit = "L" if kind == "length" else "K"
    bins = report["bins"]
    first = next(b["label"] for b in bins if b["ood"])
    shown = [first, bins[-1]["label"]]
    cells = {(r["variant"]["sees"], r["variant"]["counts"]): r for r in report["rows"]
             if r["variant"]["encoding"] == "learned" and not r["variant"]["offset"]}
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, label in zip(axes, shown):
        grid = np.full((2, 2), np.nan)
        for i, sees in enumerate(("cot", "rm")):
            for j, counts in enumerate(("trace", "frame")):
                r = cells.get((sees, counts))
                c = None if r is None else r["bins"][label]
                if c is not None:
                    grid[i, j] = 100 * c["mean"]
                text = "not run" if r is None else "not fitted" if c is None else (
                    f"{100 * c['mean']:.1f}%\n" + (f"{c['seeds']} seeds: {100 * c['min']:.1f}–{100 * c['max']:.1f}"
                                                   if c["seeds"] > 1 else "1 seed"))
                ax.text(j, i, text, ha="center", va="center", fontsize=9)
        ax.imshow(grid, vmin=0, vmax=100, cmap="Greens", alpha=0.6)
        ax.set_xticks([0, 1], ["from the trace start", "from the frame start"], fontsize=8)
        ax.set_yticks([0, 1], ["sees the whole\ntrace (CoT)", "sees the active\nframe (RM)"], fontsize=8)
        ax.set_title(f"bin {label}×{unit}", fontsize=9)
    fig.suptitle(f"{kind} split, {unit}={threshold}: what a learner sees against where it counts positions from",
                 fontsize=10)
    fig.tight_layout()
    save_figures(fig, path)


def report_isolation(out: Path, meta: dict, dest: Path) -> dict:
    kind, threshold = meta["split_kind"], meta["threshold"]
    groups, bins = collect(member_folders(out, meta), kind, threshold)
    if not groups:
        raise NoResultsError(f"{out}: none of its member folders has an evaluated run yet")
    report = isolation_report(groups, bins)
    (dest / "table-isolation.md").write_text(isolation_tables(report, kind, threshold))
    plot_isolation(dest / "isolation", report, kind, threshold)
    return report


class IsolationComparison(SplitComparison):
    name = "isolation"

    def report(self, out: Path, meta: dict, dest: Path) -> dict:
        return report_isolation(out, meta, dest)

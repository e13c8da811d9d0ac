"""A model-size comparison: the length (or depth) split at one threshold, trained with models of
several sizes (or training options) in sibling experiment folders, read side by side.

Its folder trains nothing and holds no runs: `experiment.json` names the member folders, each
an experiment of `rlmlab run length|depth` at the same threshold, beside it in the same results
tree:

    {"kind": "scale", "members": ["../length-595-paper-cpu-steps", "../length-595-mid-paper-cpu-steps"]}

The report reads each member's runs (every learner, every seed) and tabulates, per model and
learner, its size, how many seeds fitted, the accuracy just past the threshold and in the last
bin over seeds, and where its wrong traces first leave the canonical one; the figure draws
those two accuracies against the parameter count, beside the paper's model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlmlab.errors import DataError, NoResultsError
from rlmlab.experiments.diagnostics import wrong_trace_summary
from rlmlab.experiments.folder import read_experiment_json
from rlmlab.experiments.kinds.base import ExperimentKind
from rlmlab.experiments.kinds.threshold import PAPER_TABLE2
from rlmlab.experiments.seeds import seed_indices, seeded_job
from rlmlab.experiments.tables import (
    eval_results,
    fitted,
    learner_label,
    learner_line,
    learners,
    model_shape,
    pct,
    save_figures,
    shape_label,
    training_runs,
)
from rlmlab.experiments.training_log import training_summary
from rlmlab.learning.config import TrainConfig, body_params, read_run_config
from rlmlab.learning.learner import get_learner
from rlmlab.measuring.stats import correctness, seed_cell

FROM_ZERO = "from position 0"

PAPER_SHAPE = {"n_layer": 6, "n_head": 6, "n_embd": 384}
"""The paper's model (appendix "Models and optimization"), drawn beside the members."""


def member_folders(out: Path, meta: dict) -> list[Path]:
    """The member folders `experiment.json` names, each a sibling of `out` (`../<name>`) holding
    an experiment of the comparison's split and threshold: a comparison reads results of the
    same tree, never a path elsewhere on the machine."""
    folders = []
    for entry in meta["members"]:
        if not isinstance(entry, str) or Path(entry).parent != Path("..") or Path(entry).name in ("", ".", ".."):
            raise DataError(f"{out / 'experiment.json'}: member {entry!r} is not a folder beside it (`../<name>`)")
        path = out.parent / Path(entry).name
        if not (path / "experiment.json").is_file():
            raise DataError(f"{out / 'experiment.json'}: member {entry!r} is not an experiment folder")
        member = read_experiment_json(path)
        if not (isinstance(member.get("threshold"), int) and isinstance(member.get("split"), dict)
                and isinstance(member["split"].get("bins"), list) and member["split"]["bins"]
                and all(isinstance(b, dict) and isinstance(b.get("label"), str) and isinstance(b.get("ood"), bool)
                        for b in member["split"]["bins"])):
            raise DataError(f"{path / 'experiment.json'}: not a length or depth experiment")
        if (member["kind"], member["threshold"]) != (meta["split_kind"], meta["threshold"]):
            raise DataError(f"{path}: a {member['kind']} experiment at {member['threshold']}, not the comparison's "
                            f"{meta['split_kind']} split at {meta['threshold']}")
        folders.append(path)
    return folders


def _recipe(train: TrainConfig) -> str:
    """What a run's training did beyond the preset's recipe that the table must show."""
    return f"start offsets up to {train.start_offset:,}" if train.start_offset > 0 else FROM_ZERO


def member_rows(member: Path, kind: str, threshold: int) -> list[dict]:
    """One row per learner of a member folder: model, recipe, seeds (fitted ones), and over its
    seeds the mean accuracy in domain, in the first bin past the threshold and in the last bin,
    with the wrong traces' first divergence. Out of domain only fitted seeds count: over every
    seed where all fitted, over the fitted ones (the cell says so) where only some did."""
    meta = read_experiment_json(member)  # checked by `member_folders`
    job = f"{kind}-{threshold}"
    bins = meta["split"]["bins"]
    first_ood = next((b["label"] for b in bins if b["ood"]), None)
    if first_ood is None:
        raise DataError(f"{member}: its split has no out-of-domain bin")
    seeds = seed_indices(member, job)
    rows = []
    for v in learners(member, [seeded_job(job, s) for s in seeds]):
        results, best, shapes, recipes = {}, {}, set(), set()
        for s in seeds:
            res = eval_results(member, seeded_job(job, s), v, "eval")
            run = training_runs(member, seeded_job(job, s)).get(v)
            if res is None or run is None:
                continue
            cfg = read_run_config(run, DataError)
            shape = model_shape(cfg.model, v)
            if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape.values()):
                raise DataError(f"{run / 'config.json'}: its model's layers, heads and width are not positive integers")
            shapes.add(tuple(shape.items()))
            recipes.add(_recipe(cfg.train))
            results[s], best[s] = res, training_summary(run)["best"]
        if not results:
            continue
        if len(shapes) > 1 or len(recipes) > 1:
            raise DataError(f"{member}: the seeds of {v} trained different models or recipes; compare them apart")
        shape = dict(shapes.pop())
        ood_results = {s: res for s, res in results.items() if fitted(best[s])}
        some_only = 0 < len(ood_results) < len(results)

        def over_seeds(label: str, ood: bool) -> dict | None:
            chosen = ood_results if ood else results
            if not chosen:
                return None
            try:
                m = correctness([[r for r in res if r.get("bin") == label] for res in chosen.values()],
                                f"{member} {v} bin {label}")
            except ValueError as e:
                raise DataError(str(e)) from None
            return {**seed_cell(m), "fitted_only": ood and some_only} if m.size else None

        in_domain = [r for res in results.values() for r in res if not r.get("ood")]
        wrong = wrong_trace_summary([r for res in ood_results.values() for r in res]) if ood_results else None
        rows.append({
            "member": member.name, "learner": v, "shape": shape,
            "params": body_params(shape["n_layer"], shape["n_embd"]), "recipe": recipes.pop(),
            "seeds": sorted(results), "fitted_seeds": sorted(s for s, b in best.items() if fitted(b)),
            "best_validation": {str(s): b for s, b in best.items()},
            "in_domain": float(np.mean([bool(r["correct"]) for r in in_domain])) if in_domain else None,
            "first_ood": {"bin": first_ood, **(over_seeds(first_ood, True) or {"mean": None})},
            "last": {"bin": bins[-1]["label"], **(over_seeds(bins[-1]["label"], bins[-1]["ood"]) or {"mean": None})},
            "diverge_median": wrong["diverge_median"] if wrong else None,
        })
    return rows


def _cell(c: dict) -> str:
    if c["mean"] is None:
        return "not fitted"
    text = pct(c["mean"])
    if c["seeds"] > 1:
        text = f"{text} ({pct(c['min'])}–{pct(c['max'])})"
    else:
        text = f"{text} [{pct(c['ci95'][0])}, {pct(c['ci95'][1])}]"
    return text + (", fitted seeds only" if c.get("fitted_only") else "")


def scale_table(rows: list[dict], kind: str, threshold: int) -> str:
    unit = "L" if kind == "length" else "K"
    first, last = rows[0]["first_ood"]["bin"], rows[0]["last"]["bin"]
    head = ["folder", "learner", "model", "parameters", "training positions", "seeds fitted", "in domain (%)",
            f"{first}×{unit} (%)", f"{last}×{unit} (%)", "wrong traces leave the canonical one, median token"]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        div = "–" if r["diverge_median"] is None else f"{r['diverge_median']:,.0f}"
        md.append("| " + " | ".join([
            r["member"], learner_label(r["learner"]), shape_label(r["shape"]), f"{r['params'] / 1e6:.2f}M",
            r["recipe"], f"{len(r['fitted_seeds'])} of {len(r['seeds'])}", pct(r["in_domain"]),
            _cell(r["first_ood"]), _cell(r["last"]), div]) + " |")
    paper = PAPER_TABLE2.get((kind, threshold))
    if paper is not None:
        n = body_params(PAPER_SHAPE["n_layer"], PAPER_SHAPE["n_embd"])
        for v in ("rm", "cot"):
            md.append(f"| the paper | {learner_label(v)} | {shape_label(PAPER_SHAPE)} | {n / 1e6:.2f}M | – | – | – | "
                      f"{paper[v][3]:.1f} | {paper[v][-1]:.1f} | – |")
    return (f"Model size, {kind} split at {unit} = {threshold}: each learner over its training seeds (mean, and the "
            "seeds' range, or with one seed its 95% bootstrap interval over expressions); out of domain over the "
            "seeds that reached 99% validation, and only where one did (\"fitted seeds only\" where some did not), "
            "as is the wrong traces' median. Parameters exclude the token embedding and the positional "
            "table, as the paper counts them:\n\n" + "\n".join(md) + "\n")


def plot_scale(path: Path, rows: list[dict], kind: str, threshold: int) -> None:
    """Accuracy just past the threshold (left) and in the last bin (right) against parameters:
    each seed faint, the mean bold, the paper's model as a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit = "L" if kind == "length" else "K"
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    paper = PAPER_TABLE2.get((kind, threshold))
    # Sizes are the question: learners with another position encoding stay in the table only.
    drawn = [r for r in rows if get_learner(r["learner"]).encoding is None and r["learner"] in ("rm", "cot")]
    for ax, key in zip(axes, ("first_ood", "last")):
        lines: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for r in drawn:
            c = r[key]
            if c["mean"] is None:
                continue
            color, _ = learner_line(r["learner"])
            marker = "o" if r["recipe"] == FROM_ZERO else "s"
            ax.scatter([r["params"]] * len(c["per_seed"]), [100 * x for x in c["per_seed"]], color=color,
                       alpha=0.3, s=14, marker=marker)
            lines.setdefault((r["learner"], r["recipe"]), []).append((r["params"], 100 * c["mean"]))
        for (v, recipe), pts in lines.items():
            pts.sort()
            marker = "o" if recipe == FROM_ZERO else "s"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=learner_line(v)[0], lw=1.5,
                    ms=7, label=learner_label(v) + ("" if recipe == FROM_ZERO else f", {recipe}"))
        if paper is not None:
            n = body_params(PAPER_SHAPE["n_layer"], PAPER_SHAPE["n_embd"])
            for v in ("rm", "cot"):
                ax.scatter([n], [paper[v][3 if key == "first_ood" else -1]], marker="*", s=140,
                           color=learner_line(v)[0], edgecolor="black", linewidths=0.6,
                           label=f"{learner_label(v)}, the paper")
        ax.set_xscale("log")
        ax.set_xlabel("parameters (without embeddings)")
        ax.set_title(f"bin {rows[0][key]['bin']}×{unit}")
        ax.set_ylim(-2, 102)
    axes[0].set_ylabel("final-answer accuracy (%)")
    axes[0].legend(fontsize=7, loc="center right")
    fig.suptitle(f"{kind} split, {unit}={threshold}: accuracy against model size (faint: seeds)", fontsize=10)
    fig.tight_layout()
    save_figures(fig, path)


def report_scale(out: Path, meta: dict, dest: Path) -> dict:
    kind, threshold = meta["split_kind"], meta["threshold"]
    rows = [r for member in member_folders(out, meta) for r in member_rows(member, kind, threshold)]
    if not rows:
        raise NoResultsError(f"{out}: none of its member folders has an evaluated run yet")
    rows.sort(key=lambda r: (learner_label(r["learner"]), r["params"], r["recipe"]))
    (dest / "table-scale.md").write_text(scale_table(rows, kind, threshold))
    plot_scale(dest / "scale", rows, kind, threshold)
    return {"rows": rows}


class SplitComparison(ExperimentKind):
    """A folder that trains nothing and reads sibling length or depth experiments (`members`)."""

    runnable = False
    meta_fields = {"members": list, "split_kind": str, "threshold": int}

    def check_meta(self, meta: dict, path: Path) -> None:
        super().check_meta(meta, path)
        if meta["split_kind"] not in ("length", "depth"):
            raise DataError(f"{path}: 'split_kind' must be \"length\" or \"depth\", got {meta['split_kind']!r}")
        member_folders(path.parent, meta)  # before the report writes anything


class ModelSizeComparison(SplitComparison):
    name = "scale"

    def report(self, out: Path, meta: dict, dest: Path) -> dict:
        return report_scale(out, meta, dest)

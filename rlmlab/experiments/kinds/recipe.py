"""A recipe comparison: a folder of `rlmlab train` runs on one training distribution, compared by
validation accuracy against training minutes. Reported like an experiment, never planned."""

from __future__ import annotations

from pathlib import Path

from rlmlab.errors import DataError, NoResultsError
from rlmlab.experiments.kinds.base import ExperimentKind
from rlmlab.experiments.tables import fitted, learner_label, model_shape, pct, save_figures, shape_label
from rlmlab.experiments.training_log import curve_clock, metrics_records, training_summary
from rlmlab.learning.config import read_run_config
from rlmlab.learning.learner import get_learner
from rlmlab.runlog import has_metrics

RECIPE_MARKS_MIN = (15, 30, 45, 60, 90, 120)
"""Training minutes at which the recipe table reads each run's best validation so far."""


def _clock_s(record: dict) -> float:
    """A record's training time: the process's CPU time where logged (one thread: the wall clock the
    run would have taken on a core of its own, whatever else ran beside it), else the wall clock."""
    return record.get("cpu_s", record["elapsed_s"])


def recipe_row(name: str, run_dir: Path) -> dict:
    """One training run of a recipe comparison: its settings and its validation answer accuracy
    against training minutes (`_clock_s`; best so far at each of `RECIPE_MARKS_MIN`, first minute at 99%)."""
    cfg = read_run_config(run_dir, DataError)
    recs = metrics_records(run_dir)
    val = [r for r in recs if r.get("kind") == "val" and "answer_acc" in r and "elapsed_s" in r]
    steps = [r for r in recs if r.get("kind") == "train" and r.get("step")]
    summary = training_summary(run_dir)
    reached = next((r for r in val if fitted(r["answer_acc"])), None)
    who = cfg.data.learner
    if cfg.model.positions != "learned":
        who = f"{who}@{cfg.model.positions}"  # labelled with its encoding: "CoT (RoPE)"
    return {"run": name, "learner": who, "shape": shape_label(model_shape(cfg.model, who)),
            "batch": cfg.train.batch_size, "lr": cfg.train.lr, "warmup": cfg.train.warmup_steps,
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
        cells = [r["run"], learner_label(r["learner"]), r["shape"], f"{r['batch']} ({pos})", f"{r['lr']:g}",
                 str(r["warmup"]), f"{r['step']:,}", f"{r['minutes']:.0f} ({r['cpu_minutes']:.0f})",
                 *(pct(r["at"].get(m)) for m in marks), pct(r["best"]),
                 "–" if r["minutes_to_99"] is None else f"{r['minutes_to_99']:.0f}", pct(r["last_token_acc"])]
        md.append("| " + " | ".join(cells) + " |")
    return ("Validation final-answer accuracy (%), best so far within each budget of training minutes, "
            "validation included, counted in the process's CPU time (one thread: the wall clock of a run with a "
            "core of its own; the wall clock it took is beside it):\n\n"
            + "\n".join(md) + "\n")


def plot_recipe(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clock, xlabel = curve_clock([c for r in rows for c in r["curve"]])
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for r in rows:
        if not r["curve"]:
            continue
        x = [c[clock] / 60 for c in r["curve"]]
        style = "-" if get_learner(r["learner"]).driver == "cot" else "--"
        line, = axes[0].plot(x, [100 * c["answer_acc"] for c in r["curve"]], style, label=r["run"])
        axes[1].plot(x, [100 * (1 - c["token_acc"]) for c in r["curve"]], style, color=line.get_color())
        axes[2].plot(x, [c["loss"] for c in r["curve"]], style, color=line.get_color())
    for a, label in zip(axes, ("val final-answer acc (%)", "val token error, teacher-forced (%)",
                               "val loss (teacher-forced)")):
        a.set_xlabel(xlabel)
        a.set_ylabel(label)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_figures(fig, path)


def report_recipe(out: Path, meta: dict, dest: Path) -> dict:
    rows = [recipe_row(name, out / name) for name in meta["runs"] if has_metrics(out / name)]
    if not rows:
        raise NoResultsError(f"{out}: none of the runs listed in experiment.json has a training log yet")
    (dest / "table-recipe.md").write_text(recipe_table(rows))
    plot_recipe(dest / "recipe-curves", rows)
    return {"runs": rows}


class RecipeComparison(ExperimentKind):
    name = "recipe"
    runnable = False
    meta_fields = {"runs": list}

    def report(self, out: Path, meta: dict, dest: Path) -> dict:
        return report_recipe(out, meta, dest)

    def merge_meta(self, old: dict, new: dict) -> dict:
        return {**new, "runs": old["runs"] + [r for r in new["runs"] if r not in old["runs"]]}

"""What a run's training log says: the training table of a report (steps, tokens, CPU hours,
validations, resumes) and the learning-curve figure. Pure functions of saved logs."""

from __future__ import annotations

from pathlib import Path

from rlmlab.experiments.tables import FIT_THRESHOLD, fitted, learner_label, pct, save_figure
from rlmlab.measuring.result_files import find_eval_dir, has_results, read_results
from rlmlab.measuring.stats import accuracy
from rlmlab.runlog import read_metrics


def run_fitted(kind: str, run_dir: Path) -> bool:
    """Whether a run reached the plateau by the rule its experiment's report withholds
    out-of-domain cells by: Table 3 (kind `shortcuts`) reads it off the run's accuracy on the IID
    set, every other kind off the best validation final-answer accuracy in its training log. A
    run without that evidence (no IID results, no validation) has not fitted."""
    if kind == "shortcuts":
        iid = find_eval_dir(run_dir, "iid")
        return has_results(iid) and fitted(accuracy(read_results(iid))["accuracy"])
    return fitted(training_summary(run_dir)["best"])


def metrics_records(run_dir: Path) -> list[dict]:
    """The records of a run's training log (metrics.jsonl or metrics.parquet)."""
    return read_metrics(run_dir)


def extensions(records: list[dict], reasons: tuple[str, ...] = ("max_minutes", "max_steps")) -> list[dict]:
    """The resume records where a finished run was reopened (`rlmlab run --extend`): those that
    follow an `end` record for one of `reasons`. By default the budget extensions, where under a
    time budget the learning rate restarts along the longer cosine; with ("plateau",) the runs
    reopened with a larger patience, which go on along their old schedule."""
    return [r for prev, r in zip(records, records[1:]) if prev.get("kind") == "end"
            and prev.get("reason") in reasons and r.get("kind") == "resume"]


def curve_clock(points: list[dict]) -> tuple[str, str]:
    """The time axis of learning curves drawn from `points` (validation records of every run in
    the figure): (record key, axis label). CPU time when every point logs it (one thread: the
    time the run takes on a core of its own, whatever else ran beside it, so learners trained
    side by side, paused or resumed compare fairly), else the wall clock of runs trained before
    CPU time was logged."""
    if points and all("cpu_s" in r for r in points):
        return "cpu_s", "training CPU minutes"
    return "elapsed_s", "training minutes (wall clock)"


def plot_learning_curves(path: Path, runs: dict[str, Path]) -> bool:
    """Validation answer accuracy and loss against training minutes (`curve_clock`), per learner,
    with the 99% line a fitted learner reaches and a dotted mark where a budget was extended."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = {name: metrics_records(run_dir) for name, run_dir in runs.items()}
    vals = {name: [r for r in recs if r.get("kind") == "val" and "elapsed_s" in r] for name, recs in records.items()}
    clock, xlabel = curve_clock([r for val in vals.values() for r in val])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4))
    drawn = False
    for i, (name, recs) in enumerate(records.items()):
        val = vals[name]
        if not val:
            continue
        drawn = True
        color = f"C{i}"  # one colour per learner on both panels
        x = [r[clock] / 60 for r in val]
        if any("answer_acc" in r for r in val):
            a1.plot(x, [100 * r.get("answer_acc", float("nan")) for r in val], label=learner_label(name), color=color)
        a2.plot(x, [r["loss"] for r in val], label=learner_label(name), color=color)
        for ext in extensions(recs):
            for a in (a1, a2):
                a.axvline(ext.get(clock, 0) / 60, color=color, linestyle=":", linewidth=1)
    if drawn:
        a1.axhline(100 * FIT_THRESHOLD, color="grey", linestyle="--", linewidth=0.8)
    a1.set_xlabel(xlabel)
    a1.set_ylabel("val final-answer acc (%)")
    a2.set_xlabel(xlabel)
    a2.set_ylabel("val loss (teacher-forced)")
    a2.set_yscale("log")
    for a in (a1, a2):
        if a.get_legend_handles_labels()[0]:
            a.legend()
    fig.tight_layout()
    if drawn:
        for ext in ("png", "pdf"):
            save_figure(fig, path.with_suffix(f".{ext}"))
    plt.close(fig)
    return drawn


def validation_seconds(recs: list[dict]) -> tuple[float, int]:
    """Wall seconds spent validating, and how many validations that sum leaves out.

    A validation's time is its logged `val_s`. Records written before that field existed give
    it as the gap from the training record logged just before it at the same step (the trainer
    logs, then validates); a validation off that grid (the one a budget's end triggers) has
    neither and is counted as left out."""
    seconds, unknown = 0.0, 0
    for before, r in zip([{}] + recs, recs):
        if r.get("kind") != "val":
            continue
        if "val_s" in r:
            seconds += r["val_s"]
        elif before.get("kind") == "train" and before.get("step") == r.get("step") and "elapsed_s" in r:
            seconds += r["elapsed_s"] - before["elapsed_s"]
        else:
            unknown += 1
    return seconds, unknown


def training_summary(run_dir: Path) -> dict:
    """Steps, tokens, epochs, minutes, CPU time, best validation answer accuracy and the first
    step at which validation reached `FIT_THRESHOLD` of a run, finished or not."""
    recs = metrics_records(run_dir)
    val = [r for r in recs if r.get("kind") == "val" and "answer_acc" in r]
    best = max(val, key=lambda r: r["answer_acc"], default=None)
    first_fit = next((r for r in val if fitted(r["answer_acc"])), None)
    cpu = [r["cpu_s"] for r in recs if "cpu_s" in r]
    last = recs[-1] if recs else {}
    ended = last.get("kind") == "end"
    restarted = [r["step"] for r in recs if r.get("kind") == "resume" and r.get("optimizer") == "restarted"]
    val_s, val_unknown = validation_seconds(recs)
    return {"step": last.get("step", 0), "tokens": max((r.get("tokens", 0) for r in recs), default=0),
            "epochs": max((r.get("epoch", 0) for r in recs), default=0),
            "minutes": last.get("elapsed_s", 0) / 60, "validation_minutes": val_s / 60,
            "validations_untimed": val_unknown, "cpu_hours": max(cpu) / 3600 if cpu else None,
            "best": best and best["answer_acc"], "best_step": best and best["step"],
            "first_fit_step": first_fit and first_fit["step"], "stop": last.get("reason", "?") if ended else "in progress",
            "resumed_at": [r["step"] for r in recs if r.get("kind") == "resume"],
            "extended_at": [r["step"] for r in extensions(recs)],
            "patience_lifted_at": [r["step"] for r in extensions(recs, ("plateau",))],
            "validations": [{k: r[k] for k in ("step", "elapsed_s", "answer_acc", "token_acc") if k in r}
                            for r in val]} | ({"restarted_at": restarted} if restarted else {})


def _epochs(e: float) -> str:
    return f"{e:.2f}" if e < 10 else f"{e:,.0f}"  # a small IID set is passed hundreds of times


def _step(step: int | None) -> str:
    return "–" if step is None else f"{step:,}"


def training_table(summaries: list[dict]) -> str:
    """Markdown table of `training_summary` records (each with its `job` and `learner`)."""
    md = ["| run | learner | steps | training tokens | epochs | CPU hours | minutes | of which validating | "
          f"best val final answer (%) | at step | first at ≥ {100 * FIT_THRESHOLD:.0f}% | stop |",
          "|---" * 12 + "|"]
    for t in summaries:
        validating = ("≥ " if t["validations_untimed"] else "") + f"{t['validation_minutes']:.0f}"
        cpu = t.get("cpu_hours")
        md.append(f"| {t['job']} | {learner_label(t['learner'])} | {t['step']:,} | {t['tokens'] / 1e6:.1f}M | "
                  f"{_epochs(t['epochs'])} | {'–' if cpu is None else format(cpu, '.2f')} | {t['minutes']:.0f} | "
                  f"{validating} | {pct(t['best'])} | {_step(t['best_step'])} | {_step(t.get('first_fit_step'))} | "
                  f"{t['stop']} |")
    curves = [f"- {t['job']} {learner_label(t['learner'])}: " + ", ".join(
        f"{pct(v['answer_acc'])} / {pct(v.get('token_acc'))} ({v['step']:,}; {v.get('elapsed_s', 0) / 60:.0f} min)"
        for v in t["validations"]) for t in summaries if t["validations"]]
    resumed = [f"- {t['job']} {learner_label(t['learner'])}: at step " + ", ".join(
        f"{s:,}" + (" (budget extended)" if s in t.get("extended_at", ())
                    else " (after a plateau stop, with a larger patience)" if s in t.get("patience_lifted_at", ())
                    else "") + (" (carried without optimizer state: AdamW's moments restarted from zero)"
                                if s in t.get("restarted_at", ()) else "") for s in t["resumed_at"])
        for t in summaries if t.get("resumed_at")]
    return ("Training runs (validation final-answer accuracy picks the checkpoint that is tested; "
            "`CPU hours` is the training process's CPU time over all its sessions, validation included "
            "(– where the log predates it); `minutes` is wall-clock training time, validation included, ≥ "
            f"where a validation's time was not logged; `first at ≥ {100 * FIT_THRESHOLD:.0f}%` is the step of "
            "the first validation at the fitting threshold):\n\n" + "\n".join(md) + "\n"
            + ("\nResumed from their `last` checkpoint in a new process (after an interruption, or reopened "
               "with a larger budget or patience):\n\n" + "\n".join(resumed) + "\n" if resumed else "")
            + ("\nValidation final-answer / teacher-forced token accuracy (%) at each validation (step; minutes):\n\n"
               + "\n".join(curves) + "\n" if curves else ""))

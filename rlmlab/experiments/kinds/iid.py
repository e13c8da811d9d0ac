"""The IID sweep (the paper's sample-complexity figure): both learners at nested training-set
sizes, several seeds at the smaller sizes, tested on one IID test set."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlmlab.errors import ConfigError, DataError, NoResultsError
from rlmlab.experiments.folder import check_split, ensure_data, load_pool, write_meta
from rlmlab.experiments.job import Job
from rlmlab.experiments.kinds.base import ExperimentKind
from rlmlab.experiments.presets import ExperimentPreset
from rlmlab.experiments.tables import (
    eval_results,
    learner_label,
    learner_line,
    learners,
    near_one_decimals,
    pct,
    pct_near_one,
    save_figures,
    training_runs,
)
from rlmlab.experiments.training_log import plot_learning_curves
from rlmlab.measuring.stats import accuracy, bootstrap_ratio, correctness, one_run_interval, seed_cell, seed_ratio_cell

if TYPE_CHECKING:
    from rlmlab.task.taskfile import Task


def iid_points(out: Path, sizes: list[int]) -> list[dict]:
    """Per (N, learner): final-answer and per-token test accuracy, averaged over seeds.

    With one seed the final-answer interval is Wilson's and the per-token one a bootstrap over
    test expressions. With several, both come from the two-level bootstrap of the length and
    depth reports (`rlmlab.measuring.stats.seed_cell`): it resamples the seeds and the expressions, so
    an interval is wide when the seeds disagree, as a seed's own value may lie outside an
    interval over expressions alone. They come with the interval of where one run lands
    (`run95`, `per_token_run95`: `one_run_interval`), which holds every seed's value where the
    mean's interval need not."""
    points = []
    jobs = iid_runs(out)
    names = learners(out, list(jobs))
    for n in sizes:
        for name in names:
            per_seed = [res for job, (size, _) in jobs.items() if size == n
                        if (res := eval_results(out, job, name, "test")) is not None]
            if not per_seed:
                continue
            exprs = [r["expr"] for r in per_seed[0]]
            if any([r["expr"] for r in res] != exprs for res in per_seed[1:]):
                raise DataError(f"{out}: the seeds of N={n} ({learner_label(name)}) were tested on "
                                "different expressions")
            k = len(per_seed)
            p = {"N": n, "learner": name, "seeds": k, **accuracy([r for res in per_seed for r in res]),
                 "seed_accuracy": [accuracy(res)["accuracy"] for res in per_seed]}
            if k > 1:
                m = correctness(per_seed, f"{out} N={n} {learner_label(name)}")
                p["ci95"], p["run95"] = seed_cell(m)["ci95"], one_run_interval(m)
            if all("tf_total" in res[0] for res in per_seed):
                c = np.asarray([[r["tf_correct"] for r in res] for res in per_seed], dtype=np.float64)
                t = np.asarray([[r["tf_total"] for r in res] for res in per_seed], dtype=np.float64)
                p["per_token"] = float(c.sum() / t.sum())
                if k > 1:
                    p["per_token_ci95"], p["per_token_run95"] = seed_ratio_cell(c, t)["ci95"], one_run_interval(c, t)
                else:
                    p["per_token_ci95"] = list(bootstrap_ratio(c[0], t[0]))
                p["seed_per_token"] = [float(x) for x in c.sum(axis=1) / t.sum(axis=1)]
            points.append(p)
    return points


JOB_NAME = re.compile(r"iid-N(\d+)-s(\d+)")  # what `IIDSweep.job_name` writes


def iid_runs(out: Path) -> dict[str, tuple[int, int]]:
    """The IID run folders and their (size, seed), by size then seed (`iid-N300-s0`, ...)."""
    found = {}
    for d in out.glob("iid-N*-s*"):
        m = JOB_NAME.fullmatch(d.name)
        if m and d.is_dir():  # a stray folder with a similar name is not a run
            found[d.name] = (int(m[1]), int(m[2]))
    return dict(sorted(found.items(), key=lambda item: item[1]))


def report_iid(out: Path, meta: dict, dest: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    points = iid_points(out, meta["sizes"])
    if not points:
        raise NoResultsError(f"{out}: no IID test results yet (run `rlmlab run iid` first)")
    md = ["| N | learner | seeds | final answer (%) | 95% CI | one run, 95% | per seed (%) | per-token (%) | 95% CI "
          "| one run, 95% |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    # Per token, to the precision that shows the shortfall from 100% (the same for both learners
    # of a size): at large N it is a few hundredths of a point, and the paper reads which
    # learner is ahead there.
    decimals = {}
    for p in points:
        if "per_token" in p:
            decimals[p["N"]] = max(decimals.get(p["N"], 1), near_one_decimals(p["per_token"]))
    for p in points:
        tok = decimals.get(p["N"], 1)
        md.append(f"| {p['N']} | {learner_label(p['learner'])} | {p['seeds']} | {pct(p['accuracy'])} | "
                  f"{_span(p.get('ci95'))} | {_span(p.get('run95'))} | "
                  f"{' / '.join(pct(a) for a in p['seed_accuracy'])} | {pct_near_one(p.get('per_token'), tok)} | "
                  f"{_span(p.get('per_token_ci95'), tok)} | {_span(p.get('per_token_run95'), tok)} |")
    tex = [r"\begin{tabular}{@{}rlrrr@{}}", r"\toprule", r"$N$ & learner & seeds & final answer (\%) & per-token (\%) \\",
           r"\midrule"] + [f"{p['N']} & {learner_label(p['learner'])} & {p['seeds']} & {pct(p['accuracy'])} & "
                           f"{pct_near_one(p.get('per_token'), decimals.get(p['N'], 1))} \\\\" for p in points] + [r"\bottomrule", r"\end{tabular}"]
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
    for name in dict.fromkeys(p["learner"] for p in points):
        color, style = learner_line(name)
        ps = [p for p in points if p["learner"] == name]
        if not ps:
            continue
        x = [p["N"] for p in ps]
        line, = a1.plot(x, [100 * p["accuracy"] for p in ps], "o", linestyle=style, color=color,
                        label=learner_label(name))
        color = line.get_color()
        a1.fill_between(x, [100 * p["ci95"][0] for p in ps], [100 * p["ci95"][1] for p in ps], color=color, alpha=0.2)
        _scatter_seeds(a1, ps, "seed_accuracy", color)
        if all("per_token" in p for p in ps):  # fractions: the panel's logit axis takes (0, 1)
            a2.plot(x, [p["per_token"] for p in ps], "o", linestyle=style, color=color, label=learner_label(name))
            a2.fill_between(x, [p["per_token_ci95"][0] for p in ps], [p["per_token_ci95"][1] for p in ps],
                            color=color, alpha=0.2)
            _scatter_seeds(a2, ps, "seed_per_token", color, scale=1)
    sizes = sorted({p["N"] for p in points})
    for a, title in ((a1, "final-answer test accuracy (%)"), (a2, "per-token test accuracy (%, logit axis)")):
        a.set_xscale("log")
        # Log-axis minor labels collide within a decade; label the sizes that ran instead, short
        # and slanted, since 2k, 3k and 5k (or 200k, 300k and 450k) stand close together.
        a.set_xticks(sizes, [_short_size(n) for n in sizes], rotation=45, ha="right", rotation_mode="anchor")
        a.minorticks_off()
        a.set_xlabel("training expressions N")
        a.set_ylabel(title)
        a.legend()
    # A logit axis spreads 99%, 99.9% and 99.99% as far apart as 50% and 90%: at large N the
    # learners' per-token accuracies differ by hundredths of a point, flat on a linear axis.
    a2.set_yscale("logit", nonpositive="clip")
    a2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:g}"))
    a2.yaxis.set_minor_formatter(NullFormatter())
    fig.tight_layout()
    save_figures(fig, dest / "iid-sample-complexity")
    runs = iid_runs(out)
    for stale in dest.glob("curves-iid-N*-s*.*"):  # a run folder that was moved away or renamed
        if stale.stem.removeprefix("curves-") not in runs:
            stale.unlink()
    for job in runs:
        plot_learning_curves(dest / f"curves-{job}", training_runs(out, job))
    return {"points": points}


def _span(interval: list[float] | None, decimals: int = 1) -> str:
    """An interval as a table cell in percent, `–` where there is none (a one-seed size has no
    one-run interval apart from its own)."""
    return "–" if interval is None else f"{pct_near_one(interval[0], decimals)}–{pct_near_one(interval[1], decimals)}"


def _short_size(n: int) -> str:
    """A training-set size as a tick label: 300, 2k, 450k, 2.5k."""
    return str(n) if n < 1000 else f"{n / 1000:g}k"


def _scatter_seeds(ax, points: list[dict], key: str, color, scale: float = 100) -> None:
    """Each seed's own figure beside a point that averages several seeds (`scale` times it)."""
    seeds = [(p["N"], scale * a) for p in points if p["seeds"] > 1 for a in p[key]]
    if seeds:
        ax.scatter(*zip(*seeds), s=9, color=color, alpha=0.5, linewidths=0)


class IIDSweep(ExperimentKind):
    name = "iid"
    options = ("sizes", "seeds")
    meta_fields = {"sizes": list}

    def job_name(self, n: int, seed: int) -> str:
        """Folder of the run at training-set size `n` and seed index `seed` (read back by `iid_runs`)."""
        return f"iid-N{n}-s{seed}"

    def plan(self, preset: ExperimentPreset, out: Path, learners, progress: bool = True, *, task: Task, sizes=None,
             seeds=None) -> list[Job]:
        """Jobs of the IID sweep over `sizes` (default: the preset's) and the seed indices `seeds`
        (default: every seed of each size; a size with fewer seeds runs those it has). Runs on
        different sizes, seeds or learners may share the folder: the experiment lists every size
        any of them planned."""
        import pyarrow.parquet as pq

        from rlmlab.experiments.splits import Split, iid_split

        p = preset
        wanted = sorted(set(sizes or p.iid_sizes))
        if any(not isinstance(n, int) or n < 1 for n in wanted):
            raise ConfigError(f"IID sizes must be positive integers, got {sizes!r}")
        most = max(p.iid_seeds_at(n) for n in wanted)
        if seeds is not None and (not seeds or any(not isinstance(s, int) or not 0 <= s < most for s in seeds)):
            raise ConfigError(f"IID seeds must be indices 0..{most - 1} (the preset runs {most} at "
                              f"N = {', '.join(map(str, wanted))}), got {seeds!r}")

        data = out / "data" / "iid"
        pool_n = p.iid_pool_n or p.pool_n
        ensure_data(data, "split.json", lambda: iid_split(
            load_pool(p, out, task, progress, pool_n), n_test=p.iid_n_test, n_val=p.n_val,
            dedupe_train=p.iid_distinct_train, max_trace_len=p.iid_max_trace))
        split = Split.load(data, task)
        check_split(data, split.params, p, {"max_trace_len": p.iid_max_trace, "n_test": p.iid_n_test,
                                             "n_val": p.n_val, "dedupe_train": p.iid_distinct_train}, pool_n)
        available = split.train.num_rows
        sizes = [n for n in wanted if n <= available]
        skipped = [n for n in wanted if n > available]
        planned = set(sizes) | self.planned_before(out, "sizes")
        meta = {"split": split.params, "sizes": sorted(planned)}
        if skipped:
            # The paper's N = 450,000 does not fit its own 500,000-expression pool (see
            # iid_distinct_train). Recorded in experiment.json and the report, not silently dropped.
            meta["skipped_sizes"] = {"sizes": skipped, "reason": f"the split has {available} training expressions"}
            print(f"rlmlab: IID sizes {', '.join(map(str, skipped))} skipped: the split has {available} training "
                  "expressions", file=sys.stderr)
        write_meta(out, self, p, task, meta, learners)
        jobs = []
        for n in sizes:
            path = data / f"train-{n}.parquet"
            if not path.exists():
                pq.write_table(split.train_subset(n), path)
            for seed in range(p.iid_seeds_at(n)):
                if seeds is not None and seed not in seeds:
                    continue
                for v in learners:
                    config = p.run_config(v, str(path), str(data / "val.parquet"), seed=seed, stage="iid", n=n)
                    jobs.append(Job(self.job_name(n, seed), v, config, {"test": str(data / "test.parquet")},
                                    **p.eval_options))
        return jobs

    def job_names(self, out: Path, meta: dict) -> list[str]:
        return list(iid_runs(out))

    def report(self, out: Path, meta: dict, dest: Path) -> dict:
        return report_iid(out, meta, dest)

    def merge_meta(self, old: dict, new: dict) -> dict:
        return {**new, "sizes": sorted(set(old["sizes"]) | set(new["sizes"]))}

"""An experiment's saved records as pandas DataFrames, for notebooks:

    import rlmlab.results
    df = rlmlab.results.load("results/length-595-paper-cpu-steps")       # one row per expression
    df.groupby(["learner", "seed", "bin"]).correct.mean()
    log = rlmlab.results.load("results/length-595-paper-cpu-steps", what="metrics")

Every row carries where it comes from: `job` (the job folder, e.g. `length-595-s1`), `experiment_job`
(the same without its seed suffix), `seed` (the training seed index, 0 for a single-seed run),
`learner`, `fitted` (whether the run reached the plateau by the rule its report withholds
out-of-domain cells by; `df[df.fitted | ~df.ood]` keeps what the report shows) and, for
evaluations and probes, `set`. The columns are documented in docs/results-format.md. pandas is
optional (`pip install -e ".[analysis]"` in the clone); the lists of dicts
behind each frame come from `rlmlab.measuring.result_files.read_results` and
`rlmlab.runlog.read_metrics`, which need only pyarrow.
"""

from __future__ import annotations

from pathlib import Path

from rlmlab.errors import ConfigError
from rlmlab.experiments.folder import read_experiment_json
from rlmlab.experiments.refs import experiment_runs
from rlmlab.experiments.seeds import split_seed
from rlmlab.experiments.training_log import run_fitted
from rlmlab.measuring.result_files import evaluated_sets, has_results, read_results
from rlmlab.runlog import has_metrics, read_metrics

KINDS = ("eval", "probe", "metrics")


def records(folder: str | Path, what: str = "eval", traces: bool = False) -> list[dict]:
    """The records `load` makes a frame of, as dicts."""
    folder = Path(folder)
    if what not in KINDS:
        raise ConfigError(f"what={what!r}: expected one of {', '.join(KINDS)}")
    kind = read_experiment_json(folder)["kind"]
    rows = []
    for job, learner, run_dir in experiment_runs(folder):
        base, seed = split_seed(job)
        where = {"job": job, "experiment_job": base, "seed": seed, "learner": learner,
                 "fitted": run_fitted(kind, run_dir)}
        if what == "metrics":
            if has_metrics(run_dir):
                rows += [{**where, **r} for r in read_metrics(run_dir)]
            continue
        sets = (evaluated_sets(run_dir) if what == "eval" else
                {p.name: p for p in sorted((run_dir / what).glob("*")) if has_results(p)})
        for set_name, set_dir in sets.items():
            required = ("expr", "correct") if what == "eval" else ("expr",)
            rows += [{**where, "set": set_name, **r} for r in read_results(set_dir, required, traces=traces)]
    return rows


def load(folder: str | Path, what: str = "eval", traces: bool = False):
    """A pandas DataFrame of an experiment folder's per-expression evaluation results
    (`what="eval"`), probe rows (`"probe"`) or training logs (`"metrics"`), every run's rows
    stacked; with `traces`, the produced traces the evaluation kept (inexact ones) in `trace`."""
    try:
        import pandas as pd
    except ImportError:
        raise ConfigError('rlmlab.results.load needs pandas: pip install -e ".[analysis]" in the rlmlab clone '
                          "(rlmlab.results.records gives the same rows as dicts)") from None
    return pd.DataFrame.from_records(records(folder, what, traces))

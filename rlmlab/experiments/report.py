"""Tables and figures of an experiment folder: pure functions of its saved results.

`report(out)` reads `experiment.json`, lets the experiment's kind (`rlmlab.experiments.kinds`)
write its tables (Markdown and LaTeX, the rows and columns of the paper's Tables 2 and 3) and
figures (PNG and PDF), then adds the training table of every run and `report.json` with every
number shown.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlmlab.experiments.kinds import get_kind, read_experiment
from rlmlab.experiments.tables import training_runs
from rlmlab.experiments.training_log import training_summary, training_table
from rlmlab.safeio import refuse_symlinks


def report(out: str | Path, dest: str | Path | None = None) -> Path:
    """Write the report of `out` into `dest` (default `<out>/report/`); returns that folder.

    A separate `dest` lets a committed folder be checked against its own report without
    writing into it.
    """
    out = Path(out)
    meta = read_experiment(out)
    kind = get_kind(meta["kind"])
    dest = out / "report" if dest is None else Path(dest)
    refuse_symlinks(dest, "report folder")
    dest.mkdir(parents=True, exist_ok=True)
    data = kind.report(out, meta, dest)
    data["training"] = [{"job": job, "learner": name, **training_summary(run_dir)}
                        for job in kind.job_names(out, meta) for name, run_dir in training_runs(out, job).items()]
    if data["training"]:
        (dest / "table-training.md").write_text(training_table(data["training"]))
    else:
        (dest / "table-training.md").unlink(missing_ok=True)
    (dest / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    return dest

"""Check a committed results folder against a fresh run of it.

Two ways to get the fresh numbers, both into a new experiment folder:

    rerun(results, out, main)                  # re-run the commands stored in commands.jsonl
    reevaluate(results, checkpoints, out)      # evaluate released checkpoints on its expressions

then `compare(results, out)` pairs every accuracy cell of the two `report.json` files and marks
the cells where neither accuracy lies in the other's 95% interval. Runs budgeted in steps
retrain the same schedule on any machine; a folder trained under wall-clock budgets cannot be
re-run exactly (`time_budgeted` says so), only replicated.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlmlab.decoding.driver import Limits
from rlmlab.errors import ConfigError, DataError
from rlmlab.experiments.folder import read_experiment_json
from rlmlab.experiments.job import Job
from rlmlab.experiments.kinds import RUNNABLE, get_kind
from rlmlab.experiments.refs import run_path
from rlmlab.experiments.report import report
from rlmlab.experiments.run_job import RESULT_COLUMNS, run_job
from rlmlab.experiments.seeds import split_seed
from rlmlab.experiments.splits import first_per_bin
from rlmlab.learning.checkpoint import read_checkpoint_meta
from rlmlab.learning.config import RUN_CONFIG_FILE, read_run_config
from rlmlab.measuring.result_files import eval_dir, evaluated_sets, read_results
from rlmlab.runlog import has_metrics, metrics_file, read_metrics
from rlmlab.safeio import read_json, refuse_outside, shorten

CELL_KEYS = frozenset({"n", "accuracy", "ci95"})
# Fields that tell the items of a report's lists apart (a bin, a training-set size, a learner).
ID_KEYS = ("job", "construction", "N", "learner", "bin", "group")
# Their old names in reports written before the rename: a learner was its "view".
OLD_ID_KEYS = {"view": "learner"}


@dataclass(frozen=True)
class CellCheck:
    """One accuracy cell of a report, committed and fresh."""

    cell: str
    committed: dict
    fresh: dict
    spread: dict | None = None
    """The committed cell's spread over training seeds ({seeds, lo, hi}), where it has several."""

    @property
    def inside(self) -> bool:
        """Whether the two agree. Against a cell with several seeds: the fresh accuracy lies within
        the seeds' spread (their range, widened to the seeds-and-expressions bootstrap interval
        of their mean), since a fresh run is one more seed on another machine; a fresh cell of a
        sample (fewer expressions than the committed cell) agrees when its own 95% interval
        reaches the spread, since its first expressions of a bin say less than the seeds do.
        Otherwise either accuracy lies in the other's 95% interval. (A fresh cell of a sample
        has a wide interval around a committed cell of the whole set; a fresh cell of the whole
        set is held to the committed interval.)"""
        def within(x: dict, ci: dict) -> bool:
            lo, hi = ci["ci95"]
            return lo - 1e-12 <= x["accuracy"] <= hi + 1e-12

        if self.spread is not None:
            lo, hi = self.spread["lo"] - 1e-12, self.spread["hi"] + 1e-12
            if self.fresh["n"] < self.committed["n"]:
                fresh_lo, fresh_hi = self.fresh["ci95"]
                return fresh_lo <= hi and fresh_hi >= lo
            return lo <= self.fresh["accuracy"] <= hi
        return within(self.fresh, self.committed) or within(self.committed, self.fresh)


def report_cells(report_json: dict) -> dict[str, dict]:
    """Every accuracy cell ({n, accuracy, ci95}) of a report.json by a readable path, e.g.
    `rows[bin=1-1.25].cot`; the training table is left out."""
    cells: dict[str, dict] = {}

    def walk(x, path: str) -> None:
        if isinstance(x, dict):
            if CELL_KEYS <= x.keys() and isinstance(x.get("ci95"), list) and len(x["ci95"]) == 2:
                cells[path] = x
                return
            for key, value in x.items():
                if key != "training":
                    walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(x, list):
            for i, item in enumerate(x):
                if isinstance(item, dict):
                    item = {OLD_ID_KEYS.get(k, k): v for k, v in item.items()}
                ident = ",".join(f"{k}={item[k]}" for k in ID_KEYS
                                 if isinstance(item, dict) and isinstance(item.get(k), (str, int, float)))
                walk(item, f"{path}[{ident or i}]")

    walk(report_json, "")
    return cells


def _report_json(folder: Path) -> dict:
    path = folder / "report" / "report.json"
    if not os.path.lexists(path):
        raise DataError(f"{folder}: no report/report.json (run `rlmlab report {folder}` first)")
    data = read_json(path, DataError, "report")
    if not isinstance(data, dict):
        raise DataError(f"{path}: not a report")
    return data


def _fraction(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= 1


def committed_report(folder: Path) -> dict:
    """A results folder's report.json, its accuracy cells and seed spreads checked to be numbers
    the comparison can print and compare. Called before the fresh run too: the comparison reads
    the file only after it, where a string or a NaN in place of an accuracy would end the
    command in a traceback with its work done."""
    path, data = Path(folder) / "report" / "report.json", _report_json(Path(folder))
    for name, c in report_cells(data).items():
        n = c["n"]
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0
                and all(_fraction(x) for x in (c["accuracy"], *c["ci95"]))):
            raise DataError(f"{path}: cell {shorten(name)} is not a count 'n' with an 'accuracy' and 'ci95' "
                            "in [0, 1]")
    seed_spreads(data, path)
    return data


def seed_spreads(report_json: dict, where: Path | str = "report.json") -> dict[str, dict]:
    """{cell path: {seeds, lo, hi}} of the per-bin cells whose learner has several seeds in a
    threshold report (its "seeds" section): the seeds' range, widened to the bootstrap interval
    of their mean."""
    spread = report_json.get("seeds")
    if not isinstance(spread, dict) or not isinstance(spread.get("learners"), dict):
        return {}
    out = {}
    for v, d in spread["learners"].items():
        if not isinstance(d, dict) or len(d.get("seeds", ())) < 2:
            continue
        for label, c in zip(spread.get("bins", ()), d.get("cells", ())):
            if not isinstance(c, dict) or c.get("mean") is None:
                continue
            ci, per_seed = c.get("ci95"), c.get("per_seed")
            if not (isinstance(per_seed, dict) and isinstance(ci, list) and len(ci) == 2
                    and all(_fraction(x) for x in (*per_seed.values(), *ci) if x is not None) and None not in ci):
                raise DataError(f"{where}: seeds.learners.{shorten(str(v))}: a cell without accuracies "
                                "'per_seed' and 'ci95' in [0, 1]")
            values = [x for x in per_seed.values() if x is not None]
            out[f"rows[bin={label}].{v}"] = {"seeds": len(values), "lo": min(values + [c["ci95"][0]]),
                                             "hi": max(values + [c["ci95"][1]])}
    return out


def compare(committed: Path, fresh: Path) -> tuple[list[CellCheck], list[str]]:
    """The cells both reports hold, and the committed cells the fresh report lacks."""
    committed_json = committed_report(Path(committed))
    old, new = report_cells(committed_json), report_cells(committed_report(Path(fresh)))
    spreads = seed_spreads(committed_json)
    checks = [CellCheck(cell, old[cell], new[cell], spreads.get(cell)) for cell in old if cell in new]
    return checks, [cell for cell in old if cell not in new]


def comparison_table(checks: list[CellCheck], missing: list[str]) -> str:
    """Markdown: each cell's committed and fresh accuracy with their intervals and n."""
    def cell(c: dict) -> str:
        return f"{100 * c['accuracy']:.1f} [{100 * c['ci95'][0]:.1f}, {100 * c['ci95'][1]:.1f}] (n={c['n']})"

    def committed(c: CellCheck) -> str:
        if c.spread is None:
            return cell(c.committed)
        return (f"{cell(c.committed)}; seeds' spread {100 * c.spread['lo']:.1f}–{100 * c.spread['hi']:.1f} "
                f"({c.spread['seeds']} seeds)")

    lines = ["| cell | committed (%) | fresh (%) | |", "|---|---|---|---|"]
    lines += [f"| {c.cell} | {committed(c)} | {cell(c.fresh)} | {'' if c.inside else 'DISAGREE'} |"
              for c in checks]
    outside = sum(not c.inside for c in checks)
    seeded = sum(c.spread is not None for c in checks)
    rule = ("either accuracy in the other's 95% interval" if not seeded else
            f"{seeded} cells with several seeds judged against the seeds' spread, the others by either accuracy "
            "in the other's 95% interval")
    lines.append(f"\n{len(checks)} cells compared: {len(checks) - outside} agree ({rule}), {outside} disagree"
                 + (f"; {len(missing)} committed cells not re-made" if missing else "") + ".")
    return "\n".join(lines) + "\n"


# What a training log line records of the run's arithmetic (not of the machine's pace).
LOG_FIELDS = ("loss", "lr", "tokens", "grad_norm", "token_acc", "example_acc", "answer_acc")


def compare_training_logs(committed: Path, fresh: Path) -> dict[str, str]:
    """For each run that both folders trained (a training log in <job>/<learner>/): whether the fresh
    training log equals the committed one on every step both logged ("identical": the same
    run, step for step), or the first step where it does not. Cells that agree within their
    intervals cannot tell a same run from a replication; the log can."""
    verdicts = {}
    for run_dir in sorted(p for p in Path(fresh).glob("*/*") if has_metrics(p)):
        run = run_dir.relative_to(fresh)
        if not has_metrics(Path(committed) / run):
            continue
        old, new = _log_records(Path(committed) / run), _log_records(run_dir)
        both = sorted((k for k in old if k in new), key=lambda k: (k[1] or 0, k[0]))
        differ = [k for k in both if old[k] != new[k]]
        verdicts[str(run)] = (f"training log identical on all {len(both)} records both hold" if both and not differ
                              else f"training log differs from step {differ[0][1]} ({differ[0][0]})" if differ
                              else "no training record in common")
    return verdicts


def _log_records(run_dir: Path) -> dict[tuple, tuple]:
    """{(kind, step): the LOG_FIELDS values} of a run's training and validation records."""
    out = {}
    for r in read_metrics(run_dir):
        if r.get("kind") in ("train", "val"):
            out[(r["kind"], r.get("step"))] = tuple(r.get(f) for f in LOG_FIELDS)
    return out


def time_budgeted(folder: Path) -> list[str]:
    """The runs of a results folder that trained under a wall-clock budget (their schedule
    depended on the machine's pace), by folder."""
    found = []
    for path in sorted(Path(folder).rglob(RUN_CONFIG_FILE)):
        if "superseded" in path.parts:
            continue
        try:
            train = read_run_config(path.parent, DataError).train
        except DataError:  # not a run's configuration: nothing it trained to flag
            continue
        if train.max_minutes is not None and train.max_steps is None:
            found.append(str(path.parent.relative_to(folder)))
    return found


# --- re-running stored commands ---

def stored_commands(folder: Path) -> list[list[str]]:
    """The distinct `rlmlab run` command lines of a folder's commands.jsonl, in first-run order
    (a resumed run stores its command again)."""
    path = Path(folder) / "commands.jsonl"
    commands: list[list[str]] = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise DataError(f"{folder}: no commands.jsonl (not an experiment folder from `rlmlab run`)") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not text") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            argv = json.loads(line)["argv"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise DataError(f"{path}: line {i} is not a stored command") from None
        if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and argv[:2] == ["rlmlab", "run"]
                and len(argv) > 2):
            raise DataError(f"{path}: line {i} is not an `rlmlab run` command")
        if argv[2] not in RUNNABLE:
            raise DataError(f"{path}: line {i}: {shorten(repr(argv[2]))} is not an experiment kind "
                            f"({', '.join(RUNNABLE)})")
        # A re-run writes into its --out (and the default examples cache) only: a folder that a
        # stored command names may lie anywhere on this machine.
        named = [a for a in argv[3:] if _setting_key(a).rpartition(".")[2] == "cache_dir"]
        if named:
            raise DataError(f"{path}: line {i} sets data.cache_dir ({shorten(named[0])}), a folder outside "
                            "--out; a re-run writes into --out only")
        if argv not in commands:
            commands.append(argv)
    if not commands:
        raise DataError(f"{path}: no stored command")
    return commands


def _setting_key(arg: str) -> str:
    """The config key an argument of a stored command sets, e.g. `per_learner.rm.data.cache_dir`
    of `--learner-setting=per_learner.rm.data.cache_dir=/x` (or of its value given apart)."""
    return arg.removeprefix("--learner-setting=").partition("=")[0]


def _flag(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _drop_flag(argv: list[str], name: str) -> list[str]:
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == name:
            skip = True
            continue
        if not a.startswith(name + "="):
            kept.append(a)
    return kept


def _set_flag(argv: list[str], name: str, value: str) -> list[str]:
    return _drop_flag(argv, name) + [f"{name}={value}"]


# Options of a stored command that a re-run leaves out: it runs on this machine, not on the
# cluster a stored command (or a hostile commands.jsonl) names.
NOT_RERUN = ("--ray-address", "--ray-gpus-per-job")


def rerun_command(argv: list[str], out: Path, learners: list[str] | None = None, sample: int | None = None,
                  runaway_factor: int | None = None) -> list[str] | None:
    """A stored command with its folder replaced by `out`, its learners restricted to `learners`
    and its evaluation cut to the first `sample` expressions of each bin (of each set), its
    split and training left as stored; None when none of its learners is asked for. With
    `runaway_factor`, its evaluation cuts runaway rows where the committed one did, whatever the
    preset says today. It runs here: a stored `--ray-address` is left out (`NOT_RERUN`)."""
    new = [a for a in argv if a != "--quiet"]
    for name in NOT_RERUN:
        new = _drop_flag(new, name)
    new = _set_flag(new, "--out", str(out))
    if runaway_factor is not None:
        new = _set_flag(new, "--preset.eval_runaway_factor", str(runaway_factor))
    if learners is not None:
        # Commands stored before `--learners` name the learners `--views`.
        have = (_flag(argv, "--learners") or _flag(argv, "--views") or "rm,cot").split(",")
        keep = [v for v in have if v in learners]
        if not keep:
            return None
        new = _set_flag(_set_flag(new, "--views", "")[:-1], "--learners", ",".join(keep))
    if sample is not None:
        new = _set_flag(new, "--preset.eval_sample", str(sample))
    return new + ["--quiet"]


def rerun(results: Path, out: Path, run_command: Callable[[list[str]], int], learners: list[str] | None = None,
          sample: int | None = None, dry_run: bool = False, echo=print,
          check_command: Callable[[list[str]], None] | None = None) -> list[list[str]]:
    """Re-run the stored commands of `results` into `out` (see `rerun_command`), each through
    `run_command(argv)` (the command line's `main`, handed down by the command so that this
    library never imports its caller), then report `out`. Returns the command lines run.
    `check_command(argv)`, handed down the same way, parses a command line without running it
    (raising `ConfigError`): every command is checked before the first one runs, so that a
    stored option the parser does not know stops the re-run before it writes anything."""
    results, out = Path(results), Path(out)
    _check_out(results, out, dry_run)
    # A folder recorded before presets named a factor decoded with the driver's default.
    recorded = read_experiment_json(results).get("preset")
    factor = (recorded.get("eval_runaway_factor") if isinstance(recorded, dict) else None) or Limits().runaway_factor
    commands = [c for c in (rerun_command(a, out, learners, sample, factor) for a in stored_commands(results)) if c]
    if not commands:
        raise DataError(f"--learners {','.join(learners or [])}: no stored command of {results} trains those learners")
    if check_command is not None:
        for argv in commands:
            try:
                check_command(argv[1:])
            except ConfigError as e:
                raise DataError(f"{results / 'commands.jsonl'}: a stored command does not parse: {e}") from None
    for argv in commands:
        echo("$ " + " ".join(argv))
        if not dry_run and run_command(argv[1:]) != 0:
            raise DataError(f"the stored command failed: {' '.join(argv)}")
    if not dry_run:
        report(out)
    return commands


def _check_out(results: Path, out: Path, dry_run: bool = False) -> None:
    read_experiment_json(results)
    if not dry_run:  # compared only after the fresh run: checked before it starts
        committed_report(results)
    r, o = results.resolve(), out.resolve()
    if o == r or r in o.parents or o in r.parents:
        raise DataError(f"{out}: the fresh run needs a folder of its own, outside {results}")
    if (out / "experiment.json").exists() and read_experiment_json(out).get("kind") != read_experiment_json(results).get("kind"):
        raise DataError(f"{out} holds another kind of experiment; give the check its own --out")


# --- re-evaluating released checkpoints ---

def _released_runs(checkpoints: Path, results: Path, jobs: list[str]) -> dict[tuple[str, str], Path]:
    """{(job, learner): run folder with best/} for the checkpoints found under `checkpoints`,
    laid out as <job>/<learner>/best or, for a one-job experiment (its seeds aside), <learner>/best:
    the checkpoints of its seed 0, as `rlmlab/released/` holds them."""
    found = {}
    one_job = len({split_seed(job)[0] for job in jobs}) == 1
    for job in jobs:
        flat = one_job and split_seed(job)[1] == 0
        for base in (checkpoints / job, checkpoints) if flat else (checkpoints / job,):
            for run in sorted(p.parent.parent for p in base.glob("*/best/checkpoint.json")):
                if (run_path(results, job, run.name) / "eval").is_dir():
                    found.setdefault((job, run.name), run)
    if not found:
        raise DataError(f"{checkpoints}: no checkpoint (<learner>/best/checkpoint.json) of a learner evaluated in "
                        f"{results}")
    return found


def _sampled(rows: list[dict], sample: int | None) -> list[dict]:
    """The first `sample` rows of each bin (of each set when rows have no bin), as
    `--preset.eval_sample` picks them."""
    return rows if sample is None else [rows[i] for i in first_per_bin([r.get("bin") for r in rows], sample)]


def reevaluate(results: Path, checkpoints: Path, out: Path, sample: int | None = None, echo=print) -> dict:
    """Evaluate the checkpoints under `checkpoints` on the expressions `results` evaluated its
    learners on (the first `sample` of each bin), in a new experiment folder `out` that holds
    the committed training logs, then report it. Returns, per learner and set, how many
    expressions got the committed prediction and the committed first divergence."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    results, checkpoints, out = Path(results), Path(checkpoints), Path(out)
    _check_out(results, out)
    meta = read_experiment_json(results)
    kind = get_kind(meta["kind"])
    runs = _released_runs(checkpoints, results, kind.job_names(results, meta))
    taken = [str(out / job / learner) for job, learner in runs if (out / job / learner).exists()]
    if taken:
        raise DataError(f"{taken[0]} exists already: re-evaluate into a new --out")
    refuse_outside(results / "experiment.json", results)
    steps = {}
    for (job, learner), src in runs.items():
        for name in ("checkpoint.json", "model.safetensors"):
            refuse_outside(src / "best" / name, checkpoints)
        # Checked here, not first by the evaluation: it is copied into `out` before that runs.
        steps[job, learner] = read_checkpoint_meta(src / "best")["step"]
        for path in (metrics_file(run_path(results, job, learner)), run_path(results, job, learner) / "config.json"):
            if path is not None and path.exists():
                refuse_outside(path, results)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(results / "experiment.json", out / "experiment.json")
    agreement = {}
    for (job, learner), src in runs.items():
        run_dir = out / job / learner
        (run_dir / "best").mkdir(parents=True, exist_ok=True)
        for name in ("checkpoint.json", "model.safetensors"):
            shutil.copyfile(src / "best" / name, run_dir / "best" / name)
        log = metrics_file(run_path(results, job, learner))
        for path in (log, run_path(results, job, learner) / "config.json"):  # the committed training log: whether it fitted
            if path is not None and path.exists():
                shutil.copyfile(path, run_dir / path.name)
        (run_dir / "done.json").write_text(json.dumps({"step": steps[job, learner], "stop_reason": "released",
                                                       "released": str(src)}) + "\n")
        evals, committed = {}, {}
        for set_name, set_dir in evaluated_sets(run_path(results, job, learner)).items():
            rows = _sampled(read_results(set_dir), sample)
            columns = ["expr"] + [c for c in RESULT_COLUMNS if rows and all(c in r for r in rows)]
            path = out / "data" / f"{job}-{learner}-{set_name}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({c: [r[c] for r in rows] for c in columns}), path)
            evals[set_name], committed[set_name] = str(path), rows
        echo(f"{job} {learner}: evaluating {src} on {sum(len(r) for r in committed.values())} expressions")
        recorded = meta.get("preset", {})
        run_job(Job(job, learner, None, evals, recorded.get("eval_batch", 64),
                    recorded.get("eval_runaway_factor")), out, progress=False)
        for set_name, rows in committed.items():
            fresh = read_results(eval_dir(run_dir, set_name))
            same = [(a.get("prediction"), a.get("diverge_at")) == (b.get("prediction"), b.get("diverge_at"))
                    for a, b in zip(rows, fresh)]
            agreement[f"{job}/{learner}/{set_name}"] = {"n": len(rows), "same_prediction_and_divergence": sum(same),
                                                     "committed_correct": sum(r["correct"] for r in rows),
                                                     "fresh_correct": sum(r["correct"] for r in fresh)}
    report(out)
    return agreement

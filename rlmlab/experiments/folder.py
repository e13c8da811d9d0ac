"""An experiment folder and the files its jobs share.

    experiment.json               kind, preset, parameters (what `rlmlab report` reads)
    commands.jsonl                every `rlmlab run` that wrote into the folder
    data/                         the pool, the split or the shortcut data sets (parquet + JSON)
    <job>/<learner>/              a training run (rlmlab train's run folder)
    <job>/<learner>/eval/<set>/   results.parquet (+ traces.parquet) + summary.json of one evaluation set
                                  (the set "eval" in <job>/<learner>/eval/ itself; before, eval/eval/)
    report/                       tables and figures (`rlmlab report`), pure functions of the above

The checks here keep a re-run from mixing data built under other settings, or one experiment's
runs with another's; the locks let runs on different subsets share one folder (one per core).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from rlmlab.errors import ConfigError, DataError
from rlmlab.experiments.presets import ExperimentPreset, merge_learner_tables, preset_record
from rlmlab.safeio import read_json

# Lock files (empty, held with flock while a run plans or trains; `rlmlab export` leaves them out).
LOCK_NAME = ".lock"


def refuse_busy(folder: Path, busy: str) -> None:
    """Raise DataError naming `folder` and `busy` when another process holds its lock now: a check
    made before a command is recorded, so that a refused command leaves no trace (the lock itself
    is taken when the work starts, `folder_lock`)."""
    try:
        import fcntl
    except ImportError:
        return
    if not (folder / LOCK_NAME).is_file():
        return
    with open(folder / LOCK_NAME, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(f"{folder}: {busy}") from None
        fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def folder_lock(folder: Path, wait: bool = True, busy: str = "another process is using it"):
    """Hold `folder`'s lock for the duration: with `wait`, block until the process holding it lets
    go (saying so on stderr), otherwise raise DataError naming `folder` and `busy`. The OS drops
    the lock when its holder exits, so a killed run never leaves the folder locked. Without
    `fcntl` (Windows) nothing is locked. A folder this call created is removed again when the
    body fails before writing anything into it, so that a refused command leaves no trace."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    created = [d for d in (folder, *folder.parents) if not d.exists()]  # innermost first
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_NAME, "a") as f:  # "a": taking the lock leaves the folder's files as they were
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise DataError(f"{folder}: {busy}") from None
            print(f"{folder}: {busy}; waiting for it", file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        except BaseException:
            if created and [p.name for p in folder.iterdir()] == [LOCK_NAME]:
                (folder / LOCK_NAME).unlink()
                for d in created:
                    d.rmdir()
            raise


def load_pool(p: ExperimentPreset, out: Path, task, progress: bool = True, n: int | None = None):
    """The preset's pool of expressions of `task` (the preset's, resolved), `n` of them (default:
    `pool_n`), built once under `out/data/` and shared by every split drawn there."""
    from rlmlab.task.pool import build_pool, read_pool, write_pool

    n = p.pool_n if n is None else n
    path = out / "data" / f"pool-{n}-s{p.pool_seed}.parquet"
    if not path.exists():
        write_pool(build_pool(n, p.pool_seed, progress=progress, task=task), path)
    return read_pool(path, task=task)


def ensure_data(data: Path, meta_file: str, build: Callable[[], object], expected: dict | None = None,
                identity: Callable[[dict], dict] = lambda params: params) -> None:
    """Make `data` hold a complete saved data set (a split's `split.json`, a shortcut data set's
    `shortcut.json`, with the parquet files they list), building it with `build()` when a file
    is missing.

    An export keeps the JSON file and leaves the parquet files out, so an exported folder copied
    back as a run folder is rebuilt here. The data are a function of the pool (or the seed) and
    the parameters, so the rebuilt set must come out with the parameters that JSON file records
    (or, without one, `expected`), compared through `identity` (which may drop what describes the
    data rather than determines them, such as a report's wording); otherwise it is refused
    before anything is written."""
    path = data / meta_file
    if path.exists():
        doc = read_json(path, DataError, meta_file)
        entries = doc.get("tables") if isinstance(doc, dict) else None
        if not isinstance(entries, dict) or all(
                isinstance(e, dict) and isinstance(e.get("file"), str) and (data / e["file"]).exists()
                for e in entries.values()):
            return  # complete, or malformed: the loader names the problem
        expected = doc.get("params")
    built = build()
    if isinstance(expected, dict):
        old, new = identity(expected), identity(json.loads(json.dumps(built.params)))
        differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        if differ:
            raise DataError(f"{data}: built again, the data differ from what "
                            f"{meta_file if path.exists() else 'experiment.json'} records "
                            f"({', '.join(differ)}); use another --out")
    elif expected is not None:
        raise DataError(f"{path}: 'params' should be an object")
    built.save(data)


def write_meta(out: Path, kind, p: ExperimentPreset, task, extra: dict, learners) -> None:
    """Write experiment.json for an experiment of `kind` (an `ExperimentKind`) of `task` (the
    preset's, resolved); a folder that
    holds another experiment is refused rather than relabelled, which would hide its runs from
    the report. The per-learner settings of earlier runs of other learners in the folder are kept
    beside those of this run's `learners` (`merge_learner_tables`)."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {"kind": kind.name, "preset": asdict(p), "task": task.identity, **extra}
    refuse_another_experiment(out, kind.identity(meta), kind.identity)
    if (out / "experiment.json").exists():
        old = read_experiment_json(out).get("preset")
        if isinstance(old, dict):
            meta["preset"] = merge_learner_tables(old, meta["preset"], learners)
    (out / "experiment.json").write_text(json.dumps(meta, indent=2) + "\n")


def refuse_another_experiment(out: Path, identity: dict, identity_of: Callable[[dict], dict]) -> None:
    """Refuse to run an experiment with this `identity` (`ExperimentKind.identity`) in a folder
    that holds another one; `identity_of` gives the identity of the experiment.json found there
    (the kinds are not known here: `rlmlab.experiments.kinds` imports this module)."""
    if not (out / "experiment.json").exists():
        return
    old_meta = read_experiment_json(out)
    old = identity_of(old_meta)
    for key, value in identity.items():
        have = old.get(key)
        if have != value:
            if key == "task":
                task = old_meta.get("task")
                name = task.get("name", "paper") if isinstance(task, dict) else "paper"
                raise ConfigError(f"{out} holds an experiment of another task ({name!r}, {have[:12]}, not "
                                  f"{value[:12]}); give this one its own --out")
            raise ConfigError(f"{out} holds another experiment ({key} {have!r}, not {value!r}); "
                              "give this one its own --out")


def read_experiment_json(out: Path) -> dict:
    """An experiment folder's `experiment.json`: a JSON object naming its kind, its preset's
    tables under their current names (`preset_record`). Its fields are checked against that kind
    by `rlmlab.experiments.kinds.read_experiment`."""
    path = out / "experiment.json"
    if not os.path.lexists(path):
        raise DataError(f"{out}: no experiment.json (not an experiment folder from `rlmlab run`)")
    meta = read_json(path, DataError, "experiment.json")  # a FIFO in its place would block `report`
    if not isinstance(meta, dict) or not isinstance(meta.get("kind"), str):
        raise DataError(f"{path}: not an experiment description (it names no experiment 'kind')")
    if isinstance(meta.get("preset"), dict):
        try:
            meta["preset"] = preset_record(meta["preset"])
        except ConfigError as e:
            raise DataError(f"{path}: {e}") from None
    return meta


def check_saved(data: Path, saved: dict, asked: dict) -> None:
    """A re-run reuses the data it finds in `data`; refuse it when the preset now asks for
    other data, rather than report numbers of the old data under the new settings."""
    differ = [f"{k}={saved.get(k)!r} (asked: {v!r})" for k, v in asked.items() if saved.get(k) != v]
    if differ:
        raise ConfigError(f"{data} was built with {', '.join(differ)}; use another --out, or delete it to rebuild")


def check_split(data: Path, params: dict, p: ExperimentPreset, asked: dict, pool_n: int | None = None) -> None:
    """`check_saved` for a split: its own parameters and the pool it was drawn from (`pool_n`
    expressions, default the preset's `pool_n`)."""
    pool = params.get("pool") or {}
    check_saved(data, {**params, "pool n": pool.get("n"), "pool seed": pool.get("seed")},
                 {**asked, "pool n": p.pool_n if pool_n is None else pool_n, "pool seed": p.pool_seed})

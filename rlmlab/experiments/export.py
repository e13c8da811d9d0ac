"""Export an experiment folder's results (to commit them under `results/`) and merge exports of
runs of the same experiment made elsewhere."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rlmlab.errors import CheckpointError, DataError, NoResultsError, RlmlabError
from rlmlab.experiments.convert import convert_results
from rlmlab.experiments.folder import LOCK_NAME
from rlmlab.experiments.kinds import get_kind, read_experiment
from rlmlab.experiments.presets import merge_learner_tables
from rlmlab.experiments.refs import REFS, read_refs, refer_to_siblings
from rlmlab.experiments.report import report
from rlmlab.experiments.run_job import RUN_OUTPUTS, finished_marker
from rlmlab.measuring.result_files import LEGACY_RESULTS, RESULTS, TRACES, evaluated_sets
from rlmlab.records import reencode_records
from rlmlab.runlog import LEGACY_METRICS, METRICS, convert_metrics, training_finished
from rlmlab.safeio import parse_jsonl_objects, read_bytes, read_json, refuse_other_folder, refuse_symlinks, regular_file

# Weights and data files stay behind: a run's data is rebuilt from the seed-42 pool by the
# command in commands.jsonl, and checkpoints are megabytes each. The Parquet files of results
# and training logs are records, not data, and come along.
LEFT_OUT_SUFFIXES = (".parquet", ".safetensors", ".npz")
LEGACY_OF = {RESULTS: LEGACY_RESULTS, TRACES: LEGACY_RESULTS, METRICS: LEGACY_METRICS}
RECORD_FILES = tuple(LEGACY_OF)
RESUME_CHECKPOINT = "last"
EVALUATED_CHECKPOINT = "best"  # the checkpoint a run's evaluation decodes with
REBUILT = ("report", "view")  # the report is rebuilt from the copy; `rlmlab view` makes its pages on demand
# What `rlmlab run` writes at the top of an experiment folder besides its data, report and run
# folders; any other top-level file there (a README, notes) was written by a person.
MERGED = ("experiment.json", "commands.jsonl")  # merged with the destination's, not copied
TOP_LEVEL_OUTPUTS = (*MERGED, REFS)


def export_results(src: str | Path, dest: str | Path, resumable: bool = False) -> dict:
    """Copy an experiment folder's results to `dest` (e.g. under `results/` to commit them):
    configs, metrics, per-expression results, probe summaries and commands, without
    checkpoints or data files, then rebuild the report there from the copy (none while no run
    has been evaluated).

    With `resumable`, the `last` checkpoint of every unfinished run (a run folder without
    done.json) comes along too, as weights and trainer state without the optimizer's moments
    (`drop_optimizer`), so that the run can be continued on another machine: copy its run
    folder back under a fresh `--out` and re-run its command (docs/cli.md); AdamW's moments
    restart from zero there, and the run's log and training table say so. A run trained but
    stopped before its evaluation (done.json, no results under eval/) is unfinished too: a
    plain export leaves it out, and a resumable one carries its `best` checkpoint, which the
    re-run evaluates. Whether or not
    `resumable` is set, a checkpoint left in `dest` by an earlier export (the `last` of a resumable
    one) is removed once its run has finished: it would resume a run that has moved on, and
    finished results hold no weights. An export
    without `resumable` is refused while `dest` carries the `last` of a run still unfinished in
    `src`, rather than drop the only copy of its progress.

    Without `resumable`, the runs that have not finished are left out (`runs_in_flight`: for an
    `rlmlab run` experiment a run folder without done.json: training now, stopped by its
    wall-clock limit, or reopened by `--extend`; for a folder of `rlmlab train` runs one whose
    log does not end with its `end` record), with the lines of commands.jsonl that planned only
    such runs (`"runs"` of the line; lines written before commands named their runs are kept):
    results hold finished runs, and `rlmlab reproduce` re-runs only their commands. What `dest`
    holds of such a run from an earlier export stays as it was (`left_out` names them).

    The export is built in a hidden folder beside `dest` (from a copy of `dest`, when it exists)
    and renamed into place only once complete, its report written: a refused or failed export,
    or one interrupted, leaves `dest` as it was and no partial folder.

    Files already in `dest` that the source lacks (a README, say) are kept, except the old
    outputs of a run that `--extend` has since reopened (`_drop_superseded`). A top-level file
    that rlmlab does not write (a README.md, notes) is a person's: one `dest` already holds is
    never overwritten, even when the source's copy differs (a folder carried to another machine
    and back carries the README of its day), and `kept` names those that differ. Other files
    the source has are overwritten, except the two that describe the whole experiment: when `dest` holds
    the results of other runs of the same experiment (another session, machine or subset of
    constructions or sizes), `experiment.json` lists what either planned and `commands.jsonl`
    keeps both histories (`merge_meta`, `merge_commands`). Symbolic links in `src` are neither
    followed nor copied (`skipped_links` names them). Returns counts of what was copied and
    left out."""
    refuse_symlinks(dest, "export destination")  # before resolving, which would follow a link
    src, dest = Path(src).resolve(), Path(dest).resolve()
    meta = read_experiment(src)
    if dest == src or src in dest.parents or dest in src.parents:
        raise DataError(f"{dest}: the export destination must lie outside the experiment folder {src}, "
                        "and not around it")
    refuse_other_folder(dest, "experiment", "export destination")
    refuse_symlinks(dest, "export destination")
    read_refs(src)  # references are checked before anything is copied
    read_refs(dest)
    # A run is found by its config.json: one that is a folder would drop the run without a word.
    for config in (*src.glob("*/config.json"), *src.glob("*/*/config.json")):
        regular_file(config, DataError, "config.json")
    if not resumable:
        _refuse_dropping_carried_runs(src, dest)
    work = _staging(dest)
    try:
        counts = _export_into(src, work, meta, resumable, dest)
        _put_in_place(work, dest)
    except RlmlabError as e:
        shutil.rmtree(work, ignore_errors=True)
        # named by the destination the user gave, not by the staging folder
        message = str(e).replace(str(work), str(dest))
        raise (type(e) if type(e).__init__ is Exception.__init__ else DataError)(message) from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return counts


def _staging(dest: Path) -> Path:
    """A hidden folder beside `dest` to build the export in: a copy of `dest` when it exists
    (the export adds to it), else empty. Beside it, references (`../<experiment>/...`) read the
    same from there as from `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = dest.parent / f".{dest.name}.exporting-{os.getpid()}"
    if work.exists():  # left by an export of this process id that was killed
        shutil.rmtree(work)
    if dest.is_dir():
        shutil.copytree(dest, work, symlinks=True)
    else:
        work.mkdir()
    return work


def _put_in_place(work: Path, dest: Path) -> None:
    """Replace `dest` by the finished export `work`: two renames, the old folder removed last."""
    if not dest.exists():
        work.rename(dest)
        return
    old = dest.parent / f".{dest.name}.replaced-{os.getpid()}"
    dest.rename(old)
    work.rename(dest)
    shutil.rmtree(old)


def _export_into(src: Path, dest: Path, meta: dict, resumable: bool, shown: Path) -> dict:
    """`export_results` into the staging folder `dest`, which stands for `shown`."""
    old_commands, new_commands = _lines(dest / "commands.jsonl"), _lines(src / "commands.jsonl")
    taken_in = False  # `dest` is another kind's folder that takes `src`'s runs in (a sweep)
    if (dest / "experiment.json").exists():
        old = read_experiment(dest)
        # A folder of one kind may hold another kind's runs as they are (a threshold sweep, a
        # single-threshold experiment): the two merge under the kind that holds the other.
        if old["kind"] != meta["kind"]:
            if (absorbed := get_kind(old["kind"]).absorb(meta)) is not None:
                new_commands = [get_kind(old["kind"]).absorb_command(line, meta) for line in new_commands]
                meta, taken_in = absorbed, True
            elif (absorbed := get_kind(meta["kind"]).absorb(old)) is not None:
                old_commands = [get_kind(meta["kind"]).absorb_command(line, old) for line in old_commands]
                old = absorbed
        meta = merge_meta(old, meta, shown, {run.parent.name for run in src.glob("*/*/config.json")})
    in_flight = set() if resumable else runs_in_flight(src, get_kind(meta["kind"]).runnable)
    new_commands = [line for line in new_commands if not _plans_only(line, in_flight)]
    commands = merge_commands(old_commands, new_commands)
    copied = size = checkpoints = data_files = carried = 0
    kept = []  # a person's top-level files in `dest` that differ from the source's copy
    copied_lines = []  # the JSON-lines record files copied, converted below
    copied_tables = []  # the Parquet record files copied, re-encoded below
    carried_points = []  # the `last` checkpoints carried, their optimizer state dropped below
    files, links = _plain_files(src)
    for path in files:
        rel = path.relative_to(src)
        if any(rel.parts[:len(run.parts)] == run.parts for run in in_flight):
            continue
        if (rel.parts[0] in REBUILT or path.name == LOCK_NAME
                or (len(rel.parts) == 1 and rel.name in MERGED)):
            continue
        if len(rel.parts) == 1 and rel.name not in TOP_LEVEL_OUTPUTS and (dest / rel).is_file():
            if (dest / rel).read_bytes() != path.read_bytes():
                kept.append(rel.name)
            continue
        inside = next((i for i in range(1, len(rel.parts))
                       if (src / Path(*rel.parts[:i]) / "checkpoint.json").exists()), None)
        if inside is not None and not (resumable and _needed_to_continue(src / Path(*rel.parts[:inside]))):
            checkpoints += path.name == "checkpoint.json"
            continue
        if inside is not None and path.name == "optimizer.safetensors":  # carried as weights only
            continue
        if inside is None and path.suffix in LEFT_OUT_SUFFIXES and path.name not in RECORD_FILES:
            data_files += 1
            continue
        if path.suffix == ".json":  # a damaged file stops the export, named, before anything lands
            read_json(path, what=path.name)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / rel)
        if inside is not None and path.name == "checkpoint.json":
            carried_points.append(src / Path(*rel.parts[:inside]))
        if path.name in LEGACY_OF:  # an earlier export's JSON lines of the same records are stale now
            (dest / rel).with_name(LEGACY_OF[path.name]).unlink(missing_ok=True)
        if path.name in (LEGACY_RESULTS, LEGACY_METRICS):
            copied_lines.append(dest / rel)
        elif inside is None and path.name in RECORD_FILES:
            copied_tables.append(dest / rel)
        copied += 1
        size += path.stat().st_size
        carried += inside is not None and path.name == "checkpoint.json"
    dest.mkdir(parents=True, exist_ok=True)
    for ckpt in carried_points:
        if ckpt.name == RESUME_CHECKPOINT:  # `best` holds no optimizer state to drop
            _carry_weights_only(ckpt, dest / ckpt.relative_to(src))
    # What the source still holds as JSON lines lands as Parquet; files of dest's own are left alone.
    for path in copied_lines:
        if path.name == LEGACY_RESULTS:
            convert_results(path.parent, replace=True)  # over the Parquet of an earlier export
        else:
            convert_metrics(path.parent)
    # A run's records were written by the code it trained with; the folder keeps one encoding, so
    # that an unchanged run exported again leaves its committed bytes (and refs' digests) as they were.
    for path in copied_tables:
        reencode_records(path)
    _drop_superseded(src, dest, in_flight)
    _drop_stale_checkpoints(src, dest, resumable)
    # A run that a folder beside `dest` already holds byte for byte (the sweep taking in the
    # L = 595 runs of their own results folder) is kept there once, referred to from here.
    referred = refer_to_siblings(dest, {f"{c.parent.parent.name}/{c.parent.name}"
                                        for c in src.glob("*/*/config.json")}, shown) if taken_in else []
    (dest / "experiment.json").write_text(json.dumps(meta, indent=2) + "\n")
    if commands:
        (dest / "commands.jsonl").write_text("".join(line + "\n" for line in commands))
    try:
        report(dest)
        reported = True
    except NoResultsError:  # an export that only carries unfinished runs has nothing to tabulate yet
        reported = False
    return {"files": copied, "reported": reported, "bytes": size, "checkpoints": checkpoints, "data_files": data_files,
            "resume_checkpoints": carried, "referred": referred, "left_out": sorted(map(str, in_flight)), "kept": kept,
            "skipped_links": [str(link.relative_to(src)) for link in links]}


def runs_in_flight(src: Path, runnable: bool = True) -> set[Path]:
    """The run folders of an experiment folder (relative to `src`) that have not finished, so
    are not results yet: of an `rlmlab run` experiment (`runnable`), a `<job>/<learner>` folder
    holding config.json without a done.json that `rlmlab run` wrote; of a folder of `rlmlab
    train` runs, a folder holding config.json whose log does not end with its `end` record."""
    if runnable:
        return {c.parent.relative_to(src) for c in src.glob("*/*/config.json")
                if c.relative_to(src).parts[0] not in REBUILT
                and not (finished_marker(c.parent / "done.json") and _has_evaluation(c.parent))}
    return {c.parent.relative_to(src) for pattern in ("*/config.json", "*/*/config.json") for c in src.glob(pattern)
            if c.relative_to(src).parts[0] not in REBUILT and not training_finished(c.parent)}


def _plans_only(line: str, runs: set[Path]) -> bool:
    """Whether a commands.jsonl line names the runs it planned, and all of them are in `runs`."""
    try:
        planned = json.loads(line).get("runs")
    except (ValueError, AttributeError, RecursionError):
        return False
    return (isinstance(planned, list) and bool(planned) and all(isinstance(r, str) for r in planned)
            and all(Path(r) in runs for r in planned))


def _plain_files(src: Path) -> tuple[list[Path], list[Path]]:
    """The regular files under `src`, and the symbolic links there (outside the folders the
    export rebuilds), neither followed nor copied: a link may lead anywhere on the machine
    (/etc, a home folder), and an export is meant to be committed and shared."""
    files, links = [], []
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        if here != src and here.relative_to(src).parts[0] in REBUILT:
            dirnames[:] = []
            continue
        for name in list(dirnames):
            if (here / name).is_symlink():
                dirnames.remove(name)
                if not (here == src and name in REBUILT):
                    links.append(here / name)
        for name in filenames:
            path = here / name
            if path.is_symlink():
                links.append(path)
            elif path.is_file():  # not a FIFO or a device
                files.append(path)
    return sorted(files), sorted(links)


def _carry_weights_only(ckpt: Path, copy: Path) -> None:
    """Seal the copy of `ckpt` as a weights-only resume point: optimizer moments are twice the
    weights and never committed (CONTRIBUTING.md). The copy's tensor files are checked against
    their checkpoint.json first, so a checkpoint rewritten during the export is refused."""
    from rlmlab.learning.resume import drop_optimizer  # torch: only an export that carries a run needs it

    try:
        drop_optimizer(copy)
    except CheckpointError as e:
        shutil.rmtree(copy)
        raise DataError(f"{ckpt}: the checkpoint changed while it was exported; export again ({e})") from None


def _needed_to_continue(ckpt: Path) -> bool:
    """Whether `ckpt` is what continuing its unfinished run needs: the `last` checkpoint of a run
    still training, or the `best` checkpoint of one trained (done.json) but not yet evaluated,
    which its re-run evaluates."""
    run = ckpt.parent
    if ckpt.name == RESUME_CHECKPOINT:
        return not (run / "done.json").exists()
    return ckpt.name == EVALUATED_CHECKPOINT and (run / "done.json").exists() and not _has_evaluation(run)


def _has_evaluation(run: Path) -> bool:
    """Whether a run folder holds results of an evaluation (`evaluated_sets`): `run_job` writes
    done.json when training ends and evaluates after it, so a run stopped in between has done.json
    and no results, and its `best` checkpoint is still the only way to get them."""
    return bool(evaluated_sets(run))


def _refuse_dropping_carried_runs(src: Path, dest: Path) -> None:
    """Refuse an export without `resumable` that would remove a checkpoint `dest` carries for a
    run still unfinished in `src` (`_needed_to_continue`): in a folder shared by several jobs,
    exporting after one of them finishes would otherwise silently discard the only copy of
    another's progress."""
    points = (meta.parent.relative_to(dest) for meta in dest.rglob("checkpoint.json"))
    carried = sorted(str(p.parent) for p in points if (src / p.parent).is_dir() and _needed_to_continue(src / p))
    if carried:
        raise DataError(f"{dest} carries the checkpoint of {len(carried)} run(s) still unfinished in {src} "
                        f"({', '.join(carried)}); export with --resumable to update it, or delete its "
                        f"{RESUME_CHECKPOINT}/ or {EVALUATED_CHECKPOINT}/ there to stop carrying the run")


def _drop_stale_checkpoints(src: Path, dest: Path, resumable: bool) -> None:
    """Remove from `dest` the checkpoints of the runs this export brings, except those a
    resumable export carries (`_needed_to_continue`): a run that has finished since would
    be resumed from an old step, and a finished run's results hold no weights (any checkpoint an
    earlier export or a person left beside them, a `best/`, say). Runs `src` does not hold
    (another machine's) keep theirs; a plain export of a run still unfinished in `src` is
    refused before it gets here (`_refuse_dropping_carried_runs`)."""
    for meta in list(dest.rglob("checkpoint.json")):
        run = meta.parent.parent.relative_to(dest)
        if not (src / run).is_dir():
            continue
        if not (resumable and _needed_to_continue(src / run / meta.parent.name)):
            shutil.rmtree(meta.parent)


def _drop_superseded(src: Path, dest: Path, left_out: set[Path]) -> None:
    """Remove from `dest` the outputs of a run that `rlmlab run --extend` has since reopened in
    `src` (moved to its `superseded-step<N>/`, which the export copied) and not redone (probes,
    frame tables; with `--resumable`, a run still training): an earlier export's outputs would
    otherwise still describe the run's earlier end. Runs the export leaves out keep theirs."""
    for keep in src.rglob("superseded-step*"):
        run = keep.parent.relative_to(src)
        if run in left_out:
            continue
        for name in RUN_OUTPUTS:
            stale = dest / run / name
            if (src / run / name).exists() or not (keep / name).exists():
                continue
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.exists():
                stale.unlink()


def _lines(path: Path) -> list[str]:
    """The lines of a `commands.jsonl` (none when absent), each checked to be one bounded JSON
    object: a damaged history is a one-line DataError, not a file copied on."""
    if not path.exists():
        return []
    data = read_bytes(path, what="commands.jsonl")
    parse_jsonl_objects(data, str(path))
    return data.decode("utf-8").splitlines()


def merge_meta(old: dict, new: dict, where: Path, learners) -> dict:
    """`new`'s experiment description, extended by what `old` planned (`ExperimentKind.merge_meta`)
    and by the per-learner settings of `old`'s runs of learners other than `learners`, those
    `new` holds runs of (`merge_learner_tables`); refused when the two describe different
    experiments (`ExperimentKind.identity`)."""
    kind = get_kind(new["kind"])
    mine, theirs = kind.identity(new), kind.identity(old)
    for key in mine:
        if theirs.get(key) != mine[key]:
            raise DataError(f"{where} holds another experiment ({key} {theirs.get(key)!r}, exporting {mine[key]!r}); "
                            "export into another folder")
    merged = kind.merge_meta(old, new)
    if isinstance(old.get("preset"), dict) and isinstance(merged.get("preset"), dict):
        merged["preset"] = merge_learner_tables(old["preset"], merged["preset"], learners)
    return merged


def merge_commands(old: list[str], new: list[str]) -> list[str]:
    """`old` followed by what `new` adds to it: the longest start of `new` that `old` already
    holds in order (an earlier export of the same folder, perhaps with another folder's history
    after it) is written once, so re-exporting a folder after more commands adds only those,
    and exporting another folder appends its history."""
    held = 0
    for line in old:
        if held < len(new) and line == new[held]:
            held += 1
    return old + new[held:]

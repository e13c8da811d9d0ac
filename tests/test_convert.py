"""`rlmlab convert` as a transaction: a SIGKILL at any instant, then the same command again,
leaves the folder byte for byte as a conversion never interrupted; no symbolic link is followed
and nothing outside the converted folder is deleted; a line that cannot be converted stops the
conversion, naming it, with nothing changed."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import one_line_error

from rlmlab.cli import main
from rlmlab.experiments.convert import convert_folder
from rlmlab.experiments.refs import REFS, experiment_runs, read_refs
from rlmlab.journal import JOURNAL
from rlmlab.measuring.result_files import read_results, write_rows
from rlmlab.records import read_records
from rlmlab.runlog import read_metrics

ROOT = Path(__file__).resolve().parents[1]
RUNS = [("length-8", "cot"), ("length-8", "rm"), ("depth-3", "rm")]


def _legacy_run(run: Path, seed: int) -> None:
    """A small finished run in JSON lines: training log, an evaluation with traces, a probe
    without, and a Parquet file written with pyarrow's default encoding (as rlmlab once did)."""
    rng = random.Random(seed)
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"seed": seed}) + "\n")
    (run / "done.json").write_text("{}\n")
    log = [{"kind": "train", "step": s, "loss": rng.random(), "lr": 1e-3} for s in range(12)]
    log += [{"kind": "end", "reason": "max_steps", "best_step": 11}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    results = [{"expr": f"add({i},{rng.randrange(10)})", "correct": rng.random() < 0.5, "value": str(i % 10)}
               | ({"trace": " ".join(str(rng.randrange(10)) for _ in range(30))} if i % 3 else {})
               for i in range(15)]
    (run / "eval").mkdir()
    (run / "eval" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    (run / "eval" / "summary.json").write_text(json.dumps({"n": len(results)}) + "\n")
    (run / "probe").mkdir()
    rows = [{"expr": f"mul({i},2)", "positions": i, "position_differ": i % 2} for i in range(10)]
    (run / "probe" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    iid = run / "eval" / "iid"  # a second evaluation set, already Parquet in an older encoding
    iid.mkdir()
    write_rows(iid, [{"expr": f"sub({i},1)", "correct": i % 2 == 0} for i in range(20)])
    pq.write_table(pq.read_table(iid / "results.parquet"), iid / "results.parquet", compression="zstd")
    (iid / "summary.json").write_text("{}\n")
    (run / "eval" / "notes.txt").write_text("kept as it is\n")


def _experiment(folder: Path, runs, seed: int = 0) -> None:
    folder.mkdir(parents=True)
    (folder / "experiment.json").write_text(json.dumps({"kind": "length"}) + "\n")
    for i, (job, learner) in enumerate(runs):
        _legacy_run(folder / job / learner, seed + i)


def _tree(tmp_path: Path) -> Path:
    """A results tree: experiment `a` converted, holding two of the runs that experiment `b`,
    still in JSON lines, holds too; `b` also has runs of its own."""
    tree = tmp_path / "results"
    _experiment(tree / "b", RUNS)
    shutil.copytree(tree / "b", tree / "a")
    shutil.rmtree(tree / "a" / "depth-3")
    convert_folder(tree / "a")
    return tree


def snapshot(root: Path) -> dict:
    """Every file (its bytes), folder and symbolic link (its target) under `root`, by path."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            found[rel] = (("link", os.readlink(p)) if p.is_symlink() else ("dir",) if p.is_dir()
                          else ("file", p.read_bytes()))
    return found


def _records(b: Path) -> dict:
    """What readers see of experiment folder `b`: every run's training log, evaluation and probe."""
    return {(job, learner): (read_metrics(run), read_results(run / "eval"), read_results(run / "eval" / "iid"),
                             read_results(run / "probe", required=()))
            for job, learner, run in experiment_runs(b)}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """(the tree before conversion, the tree after an uninterrupted `rlmlab convert b`, what
    readers see of `b`)."""
    before = _tree(tmp_path_factory.mktemp("before"))
    after = tmp_path_factory.mktemp("after") / "results"
    shutil.copytree(before, after)
    seen = _records(after / "b")
    counts = convert_folder(after / "b")
    assert counts["results"] == 6 and counts["metrics"] == 3 and counts["referred"] == ["length-8/cot", "length-8/rm"]
    assert counts["reencoded"] == len(RUNS)  # each run's evaluation on "iid", in an older encoding
    assert _records(after / "b") == seen and len(seen) == len(RUNS)
    return before, snapshot(after), seen


# --- SIGKILL at any instant, then the same command again ---------------------------------------------

CHILD = r"""
import os, signal, sys, time
from rlmlab.experiments.convert import convert_folder
import pyarrow.parquet  # noqa: F401  (imported before the clock starts, as the first write would)

kill_at = int(sys.argv[2])
ops = 0
def counted(f):
    def call(*args, **kwargs):
        global ops
        ops += 1
        if ops == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return f(*args, **kwargs)
    return call
# Every change a conversion makes to the file system goes through one of these.
for name in ("replace", "rename", "unlink", "rmdir", "mkdir", "fsync", "open"):
    setattr(os, name, counted(getattr(os, name)))
print("ready", flush=True)
start = time.perf_counter()
convert_folder(sys.argv[1])
print(ops, time.perf_counter() - start, flush=True)
"""


def _child(folder: Path, kill_at: int = 0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(folder), str(kill_at)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _killed(proc: subprocess.Popen, delay: float | None = None) -> None:
    """Wait for a child to die of its own SIGKILL, or SIGKILL it `delay` seconds after it starts
    converting (it may finish first)."""
    if delay is not None:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, -signal.SIGKILL), err


@pytest.mark.parametrize("trials", [8, pytest.param(24, marks=pytest.mark.slow)])
def test_a_kill_at_any_instant_then_a_rerun_gives_the_clean_conversion_byte_for_byte(clean, tmp_path, trials):
    """Seeded trials (8 in CI, 24 with `-m slow`; each starts a Python or two): two thirds are
    SIGKILLs before a seeded n-th change to the file system (a journal written or not, a file
    staged or put, a run moved to the trash or half removed), every third of them with the
    re-run killed too; the rest are SIGKILLs from outside at a seeded instant, mid-write included."""
    before, expected, seen = clean
    probe = tmp_path / "probe"
    shutil.copytree(before, probe)
    out, err = _child(probe / "b").communicate(timeout=120)
    ops, seconds = int(out.split()[-2]), float(out.split()[-1])
    assert snapshot(probe) == expected, err
    rng = random.Random(92)
    for trial in range(trials):
        tree = tmp_path / f"t{trial}"
        shutil.copytree(before, tree)
        if trial < trials * 2 // 3:
            _killed(_child(tree / "b", kill_at=rng.randint(1, ops)))
            if trial % 3 == 0:  # the re-run killed as well, while it finishes what the first left
                _killed(_child(tree / "b", kill_at=rng.randint(1, ops)))
        else:
            _killed(_child(tree / "b"), delay=rng.uniform(0, 1.2 * seconds))
        assert _records(tree / "b") == seen, f"trial {trial}"  # the old files or the new ones, never a mix
        convert_folder(tree / "b")
        assert snapshot(tree) == expected, f"trial {trial}"
        shutil.rmtree(tree)


# --- symbolic links: never followed, nothing outside the folder deleted --------------------------------

@pytest.mark.parametrize("linked", ["length-8", "length-8/rm"])
def test_a_run_folder_linked_from_elsewhere_is_neither_followed_nor_deleted(clean, tmp_path, capsys, linked):
    """b's run (or its job's folder) is a symbolic link to a folder outside the tree, identical
    to a's run: the files at the link's target stay, and so does the link."""
    before, _, _ = clean
    tree, outside = tmp_path / "results", tmp_path / "elsewhere"
    shutil.copytree(before, tree)
    b = tree / "b"
    shutil.rmtree(b / "length-8")
    shutil.copytree(tree / "a" / linked, outside)  # converted already: byte for byte a's
    (b / linked).parent.mkdir(parents=True, exist_ok=True)
    (b / linked).symlink_to(outside, target_is_directory=True)
    kept = snapshot(outside)
    assert main(["convert", str(b)]) == 0
    assert "skipped 1 symbolic link(s), neither followed nor converted: " + linked in capsys.readouterr().err
    assert snapshot(outside) == kept and (b / linked).is_symlink()
    assert "length-8/rm" not in read_refs(b)


@pytest.mark.parametrize("linked", ["a", "a/length-8"])
def test_a_twin_reached_through_a_link_out_of_the_tree_is_never_referred_to(clean, tmp_path, linked):
    """The folder beside b that holds b's runs byte for byte is (or leads through) a symbolic
    link to a folder outside the results tree: b keeps its runs, and writes no reference."""
    before, _, seen = clean
    tree, outside = tmp_path / "results", tmp_path / "elsewhere"
    shutil.copytree(before, tree)
    shutil.move(tree / linked, outside)
    (tree / linked).symlink_to(outside, target_is_directory=True)
    assert main(["convert", str(tree / "b")]) == 0
    assert not (tree / "b" / REFS).exists()
    assert all((tree / "b" / job / learner / "config.json").is_file() for job, learner in RUNS)
    assert _records(tree / "b") == seen


# --- a line that cannot be converted: one line naming it, nothing changed -----------------------------

DAMAGE = {"not JSON": b'{"kind": "train", "step": 3, "lo', "a number": b"42", "a list": b'[1, 2]',
          "not UTF-8": b'{"kind": "train", "note": "caf\xe9"}'}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("rel", ["b/length-8/rm/metrics.jsonl", "b/length-8/rm/probe/results.jsonl"])
def test_a_line_that_is_not_a_record_stops_the_conversion_with_nothing_changed(clean, tmp_path, capsys, rel, damage):
    """Line 2 of the file that sorts last is damaged: the whole tree stays as it was, the files
    before it unconverted too."""
    before, _, _ = clean
    tree = tmp_path / "results"
    shutil.copytree(before, tree)
    lines = (tree / rel).read_bytes().split(b"\n")
    (tree / rel).write_bytes(b"\n".join(lines[:1] + [DAMAGE[damage]] + lines[1:]))
    kept = snapshot(tree)
    err = one_line_error(capsys, ["convert", str(tree / "b")])
    assert f"{rel}: line 2: " in err
    assert snapshot(tree) == kept


def test_only_a_last_line_cut_short_by_a_kill_is_left_out_of_a_training_log(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    whole = [{"kind": "train", "step": s, "loss": 0.5} for s in range(3)]
    text = "".join(json.dumps(r) + "\n" for r in whole)
    (run / "metrics.jsonl").write_text(text + '{"kind": "train", "st')  # the writer killed mid-line
    assert main(["convert", str(run)]) == 0
    assert read_records(run / "metrics.parquet") == whole and not (run / "metrics.jsonl").exists()
    (run / "metrics.parquet").unlink()
    (run / "metrics.jsonl").write_text(text[:40] + "\n" + text[40:])  # a line cut short in the middle
    assert "metrics.jsonl: line 1: not valid JSON" in one_line_error(capsys, ["convert", str(run)])
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


# --- what a killed conversion left ---------------------------------------------------------------------

def test_a_conversion_killed_under_an_earlier_rlmlab_is_finished(clean, tmp_path):
    """An older convert moved results.jsonl aside, wrote results.parquet and was killed while it
    wrote traces.parquet.tmp: readers saw results without their traces. Converting again puts
    the traces back."""
    before, expected, seen = clean
    tree = tmp_path / "results"
    shutil.copytree(before, tree)
    folder = tree / "b" / "depth-3" / "rm" / "eval"
    records = read_results(folder)
    (folder / "results.jsonl").rename(folder / "results.jsonl.converting")
    write_rows(folder, [{k: v for k, v in r.items() if k != "trace"} for r in records])
    (folder / "traces.parquet.tmp").write_bytes(b"PAR1 cut short")
    assert all("trace" not in r for r in read_results(folder))
    assert main(["convert", str(tree / "b")]) == 0
    assert snapshot(tree) == expected


@pytest.mark.parametrize("steps", [
    [["drop", "../../a/experiment.json", "sha256:0"]],
    [["put", "results.parquet.convert-new", "/etc/passwd", "sha256:0"]],
    [["trash", "../a", "../a/length-8/rm"]],
    [["chmod", "results.jsonl"]],
])
def test_a_journal_naming_anything_but_the_folders_own_files_is_refused(clean, tmp_path, capsys, steps):
    before, _, _ = clean
    tree = tmp_path / "results"
    shutil.copytree(before, tree)
    (tree / "b" / "depth-3" / "rm" / JOURNAL).write_text(json.dumps({"format": "rlmlab-convert-journal/1",
                                                                     "steps": steps}))
    kept = snapshot(tree)
    assert "not a rlmlab-convert-journal/1 file" in one_line_error(capsys, ["convert", str(tree / "b")])
    assert snapshot(tree) == kept

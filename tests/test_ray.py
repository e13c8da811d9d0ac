"""`rlmlab run --ray-address` against a real Ray cluster started on this machine (a head node with
2 CPUs, stopped at the end): the smoke experiment spread over the cluster gives the results of the
local run, a re-run resumes only what is unfinished, and failures are one-line errors.

Needs the `ray` extra: without it the file skips, on one line. The README's test command leaves
the extra out (about 50 packages); `.ci/run` installs it and checks that Ray imports, so CI runs
these tests. What a user without Ray gets is tested in tests/test_cluster.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (.ci/run installs it)")

from rlmlab.cli import main  # noqa: E402
from rlmlab.measuring.result_files import evaluated_sets, read_results  # noqa: E402
from rlmlab.runlog import read_metrics  # noqa: E402

SMOKE = ["run", "length", "--preset", "smoke", "--threads", "1", "--quiet"]
HEAD_START_TIMEOUT_S = 90  # per try
HEAD_STARTS = 3
PATHS_AND_TIMINGS = ("run_dir", "data", "seconds", "expr_per_s", "tokens_per_s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args: str) -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts", *args]


def _start_head() -> tuple[subprocess.Popen, str, str]:
    """`ray start --head --block` on a free port; returns the process, its temporary folder and address."""
    temp = tempfile.mkdtemp(prefix="rlmlab-ray-")
    port = _free_port()
    with open(Path(temp, "head.log"), "w") as log:
        head = subprocess.Popen(
            _ray("start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
                 "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}",
                 f"--ray-client-server-port={_free_port()}", f"--dashboard-port={_free_port()}",
                 f"--dashboard-agent-listen-port={_free_port()}"),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return head, temp, f"127.0.0.1:{port}"


def _stop_head(head: subprocess.Popen, temp: str) -> None:
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_address():
    """A Ray head on this machine with 2 CPUs; yields its address.

    `ray start --block` stops its cluster, and only that one, when it gets SIGTERM (`ray stop`
    would stop every Ray cluster of the machine). Ray announces the machine's own address
    rather than 127.0.0.1, but nothing outside the machine joins. The temporary folder is short
    because Ray puts Unix sockets in it. Ray gives its raylet a fixed 30 s to register and then
    exits ("The current node timed out during startup"); on a loaded 2-core machine that happens,
    so a head that exits is started again, HEAD_STARTS times in all, before the test fails."""
    logs = []
    for _ in range(HEAD_STARTS):
        head, temp, address = _start_head()
        deadline = time.monotonic() + HEAD_START_TIMEOUT_S
        while True:
            status = subprocess.run(_ray("status", f"--address={address}"), check=False, capture_output=True,
                                    text=True)
            if status.returncode == 0 and "CPU" in status.stdout:
                break
            if head.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(1)
        if head.poll() is None and status.returncode == 0 and "CPU" in status.stdout:
            break
        logs.append(Path(temp, "head.log").read_text()[-3000:])
        _stop_head(head, temp)
    else:
        pytest.fail(f"the Ray head did not start in {HEAD_STARTS} tries; the last one's log:\n" + logs[-1])
    try:
        yield address
    finally:
        _stop_head(head, temp)


def _start_rlmlab(cwd: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "rlmlab", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _rlmlab(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    run = _start_rlmlab(cwd, *args)
    try:
        stdout, stderr = run.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        run.kill()
        raise
    return subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory, request):
    """The smoke length experiment run locally (`local/`) and on the cluster (`cluster/`), with
    relative --out as a user types it."""
    cwd = tmp_path_factory.mktemp("runs")
    local = _start_rlmlab(cwd, *SMOKE, "--out", "local")  # while the head starts
    ray_address = request.getfixturevalue("ray_address")
    local_stderr = local.communicate(timeout=300)[1]
    assert local.returncode == 0, local_stderr
    cluster = _rlmlab(cwd, *SMOKE, "--out", "cluster", "--ray-address", ray_address)
    assert cluster.returncode == 0, cluster.stderr
    return cwd, cluster.stderr


def _results(out: Path) -> dict:
    """{job/learner/set: (per-expression results, summary without paths and timings)} of an experiment folder."""
    found = {}
    for folder in sorted(p for run in out.glob("*/*") for p in evaluated_sets(run).values()):
        summary = json.loads((folder / "summary.json").read_text())
        summary = {k: v for k, v in summary.items() if k not in PATHS_AND_TIMINGS}
        found[str(folder.relative_to(out))] = (read_results(folder), summary)
    return found


def test_cluster_run_gives_the_results_of_the_local_run(both_runs):
    cwd, stderr = both_runs
    assert "2 jobs on the Ray cluster at" in stderr and "length-96/rm: done" in stderr
    local, cluster = _results(cwd / "local"), _results(cwd / "cluster")
    assert sorted(local) == ["length-96/cot/eval", "length-96/rm/eval"]
    assert cluster == local


def test_rerun_on_the_cluster_resumes_only_unfinished_jobs(both_runs, ray_address):
    """A run started locally, half undone (the CoT run unfinished and not evaluated), continues on
    the cluster: the finished RM job is left alone, the CoT run resumes from `last`."""
    cwd, _ = both_runs
    before = _results(cwd / "local")
    rm_files = {p: p.stat().st_mtime_ns for p in (cwd / "local/length-96/rm").rglob("*") if p.is_file()}
    cot = cwd / "local/length-96/cot"
    trained = _step_records(cot)
    (cot / "done.json").unlink()
    shutil.rmtree(cot / "eval")
    rerun = _rlmlab(cwd, *SMOKE, "--out", "local", "--ray-address", ray_address)
    assert rerun.returncode == 0, rerun.stderr
    assert {p: p.stat().st_mtime_ns for p in rm_files} == rm_files
    # Resumed, not trained again: a new run would log its validations anew, with other timings.
    assert _step_records(cot) == trained and (cot / "done.json").exists()
    assert any(r["kind"] == "resume" for r in read_metrics(cot))
    assert _results(cwd / "local") == before


def _step_records(run_dir: Path) -> list[dict]:
    """The training and validation records of a run's training log (timings included)."""
    return [r for r in read_metrics(run_dir) if r["kind"] not in ("end", "resume")]


def test_a_failing_job_is_a_one_line_error(both_runs, ray_address, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(both_runs[0] / "cluster", broken)
    shutil.rmtree(broken / "length-96/rm/eval")
    (broken / "length-96/rm/best/model.safetensors").write_bytes(b"not a checkpoint")
    run = _rlmlab(tmp_path, *SMOKE, "--out", "broken", "--ray-address", ray_address)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert run.stderr.splitlines()[-1].startswith("rlmlab run: error: ")
    assert "broken/length-96/rm/best" in run.stderr.splitlines()[-1]


def test_more_threads_than_any_node_has_is_refused(both_runs, ray_address):
    run = _rlmlab(both_runs[0], *SMOKE, "--out", "cluster", "--threads", "3", "--ray-address", ray_address)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [("rlmlab run: error: a job asks for 3 threads (--threads) but the "
                                        "largest node of the Ray cluster has 2 CPUs")]


def test_an_unreachable_address_is_a_one_line_error(tmp_path, capsys):
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    assert main([*SMOKE, "--out", str(tmp_path), "--ray-address", address]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"rlmlab run: error: --ray-address {address}: no Ray head answers there")
    assert not (tmp_path / "data").exists()  # refused before any data is built

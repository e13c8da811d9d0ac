"""Pools (determinism, columns, validation) and the CLI's behaviour on good and bad input."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from rlmlab.cli import main
from rlmlab.errors import DataError
from rlmlab.task.pool import build_pool, read_pool, write_pool
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def test_pool_is_the_same_for_any_number_of_workers():
    a = build_pool(9000, 7, workers=1, task=PAPER)
    b = build_pool(9000, 7, workers=2, task=PAPER)
    assert a.equals(b)
    assert not a.equals(build_pool(9000, 8, workers=1, task=PAPER))


def test_pool_rows_match_the_executor():
    pool = build_pool(500, 3, workers=1, task=PAPER).to_pylist()
    assert [r["id"] for r in pool] == list(range(500))
    for row in pool[:200]:
        ex = PAPER.execute(row["expr"])
        assert row["value"] == ex.value_token and row["root"] == ex.expr.fn
        assert (row["trace_len"], row["max_depth"], row["max_frame_width"], row["n_frame_examples"]) == \
               (ex.trace_len, ex.max_depth, ex.max_frame_width, ex.n_frame_examples)
        assert row["type"] == ("bool" if ex.value_token in ("True", "False") else "int")


def test_generator_respects_nesting_depth_and_root_uniformity():
    pool = build_pool(20000, 42, workers=2, task=PAPER).to_pylist()

    def level(e):
        return 0 if isinstance(e, str) else 1 + max(level(a) for a in e.args)

    assert max(level(PAPER.parse(r["expr"])) for r in pool) == 3
    roots = {}
    for r in pool:
        roots[r["root"]] = roots.get(r["root"], 0) + 1
    assert len(roots) == 21 and min(roots.values()) > 20000 / 21 * 0.85


def test_pool_file_roundtrip_and_bad_files(tmp_path):
    path = tmp_path / "p.parquet"
    write_pool(build_pool(100, 1, workers=1, task=PAPER), path)
    assert read_pool(path, task=PAPER).num_rows == 100
    with pytest.raises(DataError, match="no such file"):
        read_pool(tmp_path / "missing.parquet", task=PAPER)
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="not a readable parquet"):
        read_pool(tmp_path / "junk.parquet", task=PAPER)
    import pyarrow as pa
    pq.write_table(pa.table({"expr": ["add(1,2)", "add(1,"]}), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="row 1"):
        read_pool(tmp_path / "bad.parquet", task=PAPER)


def test_cli_pool(tmp_path, capsys):
    out = tmp_path / "pool.parquet"
    assert main(["data", "pool", "--n", "300", "--seed", "5", "--out", str(out), "--quiet"]) == 0
    assert pq.read_table(out).equals(build_pool(300, 5, workers=1, task=PAPER).replace_schema_metadata(
        pq.read_table(out).schema.metadata))


def test_cli_trace_json(capsys):
    assert main(["trace", "--json", "add(sum_of_squares(2,3),double(4))", "less(1,2)"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["value"] for r in rows] == ["1", "True"]
    r = rows[0]
    assert r["trace_len"] == len(r["tokens"]) == 100 and r["max_depth"] == 4 and r["n_frame_examples"] == 11
    assert [(f["depth"], f["m"]) for f in r["frames"]][:3] == [(1, 14), (2, 6), (3, 12)]


def test_cli_bad_expression_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-m", "rlmlab", "trace", "add(2,less(1,2))"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "column 7" in proc.stderr and "bool where int" in proc.stderr


def test_cli_stdin_bad_line_does_not_stop_the_rest():
    proc = subprocess.run([sys.executable, "-m", "rlmlab", "trace", "--json", "-"], input="add(1,2)\nfoo(3)\nsquare(4)\n",
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert [json.loads(x)["value"] for x in proc.stdout.splitlines()] == ["3", "6"]
    assert "unknown function 'foo'" in proc.stderr


def test_cli_plain_output_is_uncolored_when_piped():
    proc = subprocess.run([sys.executable, "-m", "rlmlab", "trace", "add(square(double(2)),1)"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "\033[" not in proc.stdout
    assert "F5   d=1  m=15  add ( square ( double ( 2 ) ) , 1 ) x := 6 | y := 1 return <return> 7 </return>" \
        in proc.stdout


def test_sampler_restricts_roots_and_rejects_unknown_ones():
    import random

    from rlmlab.errors import ConfigError
    from rlmlab.task.sampler import ExpressionSampler

    sampler, rng = ExpressionSampler(roots=["factorial", "clamp"], library=PAPER.library), random.Random(3)
    roots = [sampler.sample(rng).fn for _ in range(400)]
    assert set(roots) == {"factorial", "clamp"} and 150 < roots.count("clamp") < 250
    for bad in (["no_such_fn"], []):
        with pytest.raises(ConfigError, match="roots: unknown function"):
            ExpressionSampler(roots=bad, library=PAPER.library)

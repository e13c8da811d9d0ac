"""`rlmlab run --ray-address` where no cluster can run it: without Ray the error names the extra,
and a node that does not mount `--out` says so. Neither needs Ray installed, so these run
everywhere; the tests against a real cluster are in tests/test_ray.py."""

from __future__ import annotations

import sys

import pytest

from rlmlab.cli import main

SMOKE = ["run", "length", "--preset", "smoke", "--threads", "1", "--quiet"]


def test_without_ray_the_error_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main([*SMOKE, "--out", str(tmp_path), "--ray-address", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err == "rlmlab run: error: --ray-address needs Ray: pip install 'rlmlab[ray]'\n"
    assert not (tmp_path / "data").exists()


def test_a_node_without_the_shared_folder_names_it(tmp_path):
    """What a task reports on a node that does not mount --out (run here, outside Ray)."""
    from rlmlab.errors import DataError
    from rlmlab.experiments.cluster import _run_on_node
    from rlmlab.experiments.job import Job
    from rlmlab.experiments.presets import config_from_settings

    config = config_from_settings({"train.threads": 1}, "rm", "runs/x/data/train.parquet", "runs/x/data/val.parquet")
    job = Job("length-96", "rm", config, {"eval": "runs/x/data/eval.parquet"})
    with pytest.raises(DataError, match=r"runs/x: not found on Ray node .*; --out must be on a filesystem that "
                                        r"every node mounts at the same path"):
        _run_on_node(job, "runs/x", False, str(tmp_path))

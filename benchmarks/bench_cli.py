"""Time for the command line to answer: `rlmlab --help`, `--version`, `trace`, `train --help`,
`report` and `view` of a copy of a committed experiment, and for contrast a bare
`python -c pass` and `import torch`.

Goal (issue 45): `--help` and `trace` answer within 1 s; `report`, `view` and `export` import no
torch (tests/test_cli.py checks that), so they take the time of their own work.
Each command runs `--repeat` times in a fresh interpreter; the median and the slowest are printed.

    python benchmarks/bench_cli.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

RLMLAB = [sys.executable, "-m", "rlmlab"]


def cases(tmp: Path) -> dict[str, list[str]]:
    exp = tmp / "exp"
    shutil.copytree(ROOT / "results" / "depth-5-small", exp)
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "rlmlab --help": [*RLMLAB, "--help"],
        "rlmlab --version": [*RLMLAB, "--version"],
        "rlmlab trace 'add(1,2)'": [*RLMLAB, "trace", "add(1,2)"],
        "rlmlab train --help": [*RLMLAB, "train", "--help"],
        "rlmlab report (depth-5-small)": [*RLMLAB, "report", str(exp)],
        "rlmlab view --limit 20": [*RLMLAB, "view", str(exp), "--out", str(tmp / "view"), "--limit", "20", "--quiet"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print_facts()
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        run_cases(cases(Path(tmp)), env, args.repeat)


def run_cases(cases: dict[str, list[str]], env: dict, repeat: int) -> None:
    for name, argv in cases.items():
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
            times.append(time.perf_counter() - t0)
        print(f"{name:<32} median {statistics.median(times):5.2f} s   max {max(times):5.2f} s")


if __name__ == "__main__":
    main()

"""Time for the command line to answer: `rlmlab --help`, `--version`, `trace`, and for contrast
a bare `python -c pass` and `import torch`.

Goal (issue 45): at most 1 s for the commands that need no model (`--help`, `trace`,
`report`, `view`, `export` import no torch; tests/test_cli.py checks that, this script times it).
Each command runs `--repeat` times in a fresh interpreter; the median and the slowest are printed.

    python benchmarks/bench_cli.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "rlmlab --help": [sys.executable, "-m", "rlmlab", "--help"],
    "rlmlab --version": [sys.executable, "-m", "rlmlab", "--version"],
    "rlmlab trace 'add(1,2)'": [sys.executable, "-m", "rlmlab", "trace", "add(1,2)"],
    "rlmlab train --help": [sys.executable, "-m", "rlmlab", "train", "--help"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print_facts()
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for name, argv in CASES.items():
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
            times.append(time.perf_counter() - t0)
        print(f"{name:<28} median {statistics.median(times):5.2f} s   max {max(times):5.2f} s")


if __name__ == "__main__":
    main()

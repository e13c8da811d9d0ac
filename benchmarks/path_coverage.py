"""What a default run executes of the token's path that docs/architecture.md lists.

Runs the `smoke` length experiment over two seeds and its report under coverage.py, with an
empty example cache, then prints, per module of the path: its lines, its statements, the share
of statements the run executed, and the functions it never entered (relocation candidates,
or input checks that a clean run never reaches). Seconds on one core; needs `coverage`
(`pip install coverage`).

    python benchmarks/path_coverage.py [--functions]
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rlmlab"


def path_modules() -> list[str]:
    """The modules of docs/architecture.md's path table, in order (the rule tests/test_imports.py reads)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## One token's path")[1].split("That is ")[0]
    return [m for line in table.splitlines() if line.startswith("| ") and not line.startswith("| step")
            for m in re.findall(r"`([a-z_/]+\.py)`", line.split("|")[2])]


def functions(source: str) -> list[tuple[str, int, int, int]]:
    """(qualified name, `def` line, first body line, last line) of every function and method,
    nested ones included (decorators not counted)."""
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child.lineno, child.body[0].lineno, child.end_lineno))
                walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")

    walk(ast.parse(source), "")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--functions", action="store_true", help="list each module's functions never entered")
    args = ap.parse_args()
    try:
        import coverage
    except ImportError:
        sys.exit("path_coverage.py: needs coverage.py (pip install coverage)")
    print_facts()
    modules = path_modules()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rc = tmp / "coveragerc"
        rc.write_text(f"[run]\nparallel = true\nconcurrency = multiprocessing,thread\nsource = {PACKAGE}\n"
                      f"data_file = {tmp / '.coverage'}\n")
        # An empty HOME: the example cache is empty, so the examples are built as on a first run.
        env = dict(os.environ, HOME=str(tmp / "home"), COVERAGE_RCFILE=str(rc))
        run = [sys.executable, "-m", "coverage", "run", "-m", "rlmlab"]
        for cmd in (["run", "length", "--preset", "smoke", "--seeds", "0,1", "--out", str(tmp / "x"), "--threads", "1",
                     "--quiet"], ["report", str(tmp / "x")]):
            done = subprocess.run(run + cmd, env=env, cwd=tmp, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"path_coverage.py: `rlmlab {' '.join(cmd)}` failed: {done.stderr.strip().splitlines()[-1:]}")
        data = coverage.Coverage(config_file=str(rc))
        data.combine()
        data.load()
        print(f"command: rlmlab run length --preset smoke --seeds 0,1, then rlmlab report ({len(modules)} modules)")
        print(f"{'module':34s} {'lines':>5s} {'stmts':>5s} {'run %':>5s} {'lines in functions never entered':>33s}")
        totals = [0, 0, 0, 0]
        for m in modules:
            path = PACKAGE / m
            source = path.read_text()
            _, statements, _, missing, _ = data.analysis2(str(path))
            hit = set(statements) - set(missing)
            never = [(name, start, last) for name, start, body, last in functions(source)
                     if not any(body <= n <= last for n in hit)]
            # Nested functions of a function never entered count once, with it.
            outer = [f for f in never if not any(o is not f and o[1] <= f[1] and f[2] <= o[2] for o in never)]
            unused = sum(last - start + 1 for _, start, last in outer)
            lines = len(source.splitlines())
            row = [lines, len(statements), len(hit), unused]
            totals = [a + b for a, b in zip(totals, row)]
            share = 100 * len(hit) / max(1, len(statements))
            print(f"{m:34s} {lines:5d} {len(statements):5d} {share:5.0f} {unused:33d}")
            if args.functions:
                for name, start, last in outer:
                    print(f"    {name} ({last - start + 1} lines)")
        lines, stmts, hit, unused = totals
        print(f"{'total':34s} {lines:5d} {stmts:5d} {100 * hit / stmts:5.0f} {unused:33d}")


if __name__ == "__main__":
    main()

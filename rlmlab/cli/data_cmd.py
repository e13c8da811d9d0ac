"""`rlmlab data pool`: sample an expression pool to parquet."""

from __future__ import annotations

import time

from rlmlab.task.pool import build_pool, write_pool
from rlmlab.task.sampler import GeneratorConfig
from rlmlab.task.taskfile import add_task_option, load_task


def register(sub) -> None:
    p = sub.add_parser("data", help="build data sets", description="Build data sets.")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="WHAT")
    pool = dsub.add_parser("pool", help="sample an expression pool (one parquet row per expression)")
    pool.add_argument("--n", type=int, default=500_000, help="number of expressions (paper: 500000)")
    pool.add_argument("--seed", type=int, default=42, help="sampling seed (paper: 42)")
    pool.add_argument("--out", required=True, help="output parquet file")
    pool.add_argument("--workers", type=int, default=None, help="processes (default: every core); "
                      "the file is the same for any number")
    pool.add_argument("--p-lit", type=float, default=None, help="probability of a literal argument "
                      "(default: the task's; paper: 0.4)")
    pool.add_argument("--max-level", type=int, default=None, help="nesting level at which calls take only "
                      "literals (default: the task's; paper: 3)")
    add_task_option(pool)
    pool.add_argument("--quiet", action="store_true", help="no progress bar")
    pool.set_defaults(handler=run_pool)


def run_pool(args) -> int:
    t0 = time.perf_counter()
    task = load_task(args.task)
    g = task.generator
    config = GeneratorConfig(g.p_lit if args.p_lit is None else args.p_lit,
                             g.max_level if args.max_level is None else args.max_level)
    table = build_pool(args.n, args.seed, args.workers, config, progress=not args.quiet, task=task)
    write_pool(table, args.out)
    print(f"wrote {table.num_rows} expressions to {args.out} in {time.perf_counter() - t0:.1f}s")
    return 0

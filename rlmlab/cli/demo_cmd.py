"""`rlmlab demo`: the README's main job on a small built-in default."""

from __future__ import annotations

import numpy as np

from rlmlab.cli.trace_cmd import render
from rlmlab.pool import build_pool
from rlmlab.trace import execute


def register(sub) -> None:
    p = sub.add_parser("demo", help="build a small pool and show a trace (seconds)")
    p.add_argument("--n", type=int, default=20_000, help="pool size")
    p.add_argument("--seed", type=int, default=42)
    p.set_defaults(handler=run)


def run(args) -> int:
    import sys

    pool = build_pool(args.n, args.seed, progress=True)
    print(f"\npool of {pool.num_rows} expressions, seed {args.seed}")
    print(f"{'statistic':<16}{'mean':>8}{'median':>8}{'p90':>8}{'max':>8}")
    for col in ("trace_len", "max_depth", "max_frame_width", "n_frames"):
        v = np.asarray(pool.column(col))
        print(f"{col:<16}{v.mean():>8.1f}{np.median(v):>8.0f}{np.percentile(v, 90):>8.0f}{v.max():>8d}")
    print("\nthe paper's worked example:\n")
    print(render(execute("add(sum_of_squares(2,3),double(4))"), sys.stdout.isatty()))
    return 0

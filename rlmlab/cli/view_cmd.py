"""`rlmlab view PATH`: static HTML pages of an evaluation folder or of a whole experiment.

An evaluation folder (`results.parquet` + `summary.json`) becomes one page: every expression's
produced trace against the canonical one, the first divergence and the frames there. An
experiment folder (`experiment.json`) becomes an index of the report's tables and figures
linked to one such page per evaluation set.
"""

from __future__ import annotations

from rlmlab.cli.progress import stages
from rlmlab.errors import ConfigError
from rlmlab.experiments.viewer import build_view


def register(sub) -> None:
    p = sub.add_parser("view", help="static HTML pages of an evaluation or experiment folder",
                       description="Write self-contained HTML pages (no network needed) for reading a model's "
                       "failures: per expression the canonical and produced traces aligned, the first divergence, "
                       "and what RM and CoT read there; filters by bin, correctness and failure reason. From an "
                       "experiment folder: an index of the report's tables and figures linked to one page per "
                       "evaluation set.")
    p.add_argument("path", metavar="PATH", help="an evaluation folder (<run>/eval/<set>/ or <run>/eval/, with results.parquet) or "
                   "an experiment folder (with experiment.json)")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default PATH/view)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="first N expressions of each set only")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=run)


def run(args) -> int:
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {args.limit}")
    with stages(args.quiet) as stage:
        page = build_view(args.path, args.out, args.limit, stage)
    for p in page.sets:
        print(f"  {p.path}: {p.n:,} expressions, {p.bytes / 1e6:.2f} MB, {p.seconds:.1f} s")
    what = f"{len(page.sets)} evaluation pages and an index" if page.sets else f"{page.n:,} expressions"
    print(f"wrote {page.path} ({what}, {page.bytes / 1e6:.2f} MB, {page.seconds:.1f} s); open it in a browser")
    return 0

"""`rlmlab report DIR`: the paper's tables and figures from an experiment folder's saved results."""

from __future__ import annotations

from rlmlab.experiments.report import report


def register(sub) -> None:
    p = sub.add_parser("report", help="tables (Markdown, LaTeX) and figures (PNG, PDF) of an experiment folder")
    p.add_argument("out", metavar="DIR", help="experiment folder written by `rlmlab run`")
    p.set_defaults(handler=run)


def run(args) -> int:
    dest = report(args.out)
    for md in sorted(dest.glob("table-*.md")):
        print(md.read_text())
    print(f"tables and figures in {dest}")
    return 0

"""`rlmlab export SRC DEST`: an experiment's results without checkpoints or data, ready to commit."""

from __future__ import annotations

import sys

from rlmlab.experiments.export import export_results


def register(sub) -> None:
    p = sub.add_parser("export", help="copy an experiment's results (no checkpoints or data files) and "
                                      "rebuild its report there")
    p.add_argument("src", metavar="SRC", help="experiment folder written by `rlmlab run`")
    p.add_argument("dest", metavar="DEST", help="where the results go (e.g. results/length-small); "
                                                "files it has that SRC lacks are kept, and so are its own top-level "
                                                "files (a README) where SRC's copy differs")
    p.add_argument("--resumable", action="store_true",
                   help="also copy every unfinished run (left out otherwise), with its `last` checkpoint as weights "
                        "only (no optimizer moments), or its `best` one when it is trained but not yet evaluated, "
                        "to continue it on another machine (docs/cli.md, 'Carrying a run to another machine')")
    p.set_defaults(handler=run)


def run(args) -> int:
    n = export_results(args.src, args.dest, resumable=args.resumable)
    if n["skipped_links"]:
        links = n["skipped_links"]
        print(f"{args.src}: skipped {len(links)} symbolic link(s), neither followed nor copied: "
              + ", ".join(links[:5]) + (f" and {len(links) - 5} more" if len(links) > 5 else ""), file=sys.stderr)
    if n["kept"]:
        print(f"{args.dest}: kept its own {', '.join(n['kept'])} (the copy in {args.src} differs; "
              "rlmlab does not write it, so the destination's is taken to be the newer)", file=sys.stderr)
    if n["left_out"]:
        runs = n["left_out"]
        print(f"{args.src}: left out {len(runs)} unfinished run(s) and the commands that planned only them: "
              + ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
              + "; export again once they finish (or with --resumable to carry them)", file=sys.stderr)
    carried = (f" (with the `last` checkpoints of {n['resume_checkpoints']} unfinished runs, weights only)"
               if args.resumable else "")
    print(f"copied {n['files']} files ({n['bytes'] / 1e6:.1f} MB) to {args.dest}{carried}; left out "
          f"{n['checkpoints']} checkpoints and {n['data_files']} data files; "
          + (f"report in {args.dest}/report" if n["reported"] else "no report: nothing is evaluated yet")
          + (f"; {len(n['referred'])} run(s) a folder beside it holds byte for byte are kept there, by reference "
             f"(refs.json): {', '.join(n['referred'])}" if n["referred"] else ""))
    return 0

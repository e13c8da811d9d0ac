"""`rlmlab convert FOLDER...`: a results folder's JSON-lines records rewritten as Parquet, and
Parquet records written with an older encoding rewritten with today's."""

from __future__ import annotations

import sys

from rlmlab.experiments.convert import convert_folder


def register(sub) -> None:
    p = sub.add_parser("convert", help="rewrite a results folder's records as Parquet, in today's encoding")
    p.add_argument("folders", nargs="+", metavar="FOLDER", help="experiment, run or evaluation folders")
    p.set_defaults(handler=run)


def run(args) -> int:
    for folder in args.folders:
        n = convert_folder(folder)
        if n["links"]:
            links = n["links"]
            print(f"{folder}: skipped {len(links)} symbolic link(s), neither followed nor converted: "
                  + ", ".join(links[:5]) + (f" and {len(links) - 5} more" if len(links) > 5 else ""), file=sys.stderr)
        print(f"{folder}: {n['results']} result files and {n['metrics']} training logs converted, "
              f"{n['reencoded']} Parquet files re-encoded, "
              f"{n['bytes_before'] / 1e6:.1f} MB -> {n['bytes_after'] / 1e6:.1f} MB"
              + (f"; {len(n['referred'])} runs held by reference to a folder beside it ({', '.join(n['referred'])})"
                 if n["referred"] else ""))
    return 0

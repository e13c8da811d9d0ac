"""`rlmlab` command line: thin entry points over the library.

Each subcommand lives in its own module with `register(subparsers)`; user errors
(`RlmlabError`, and OS errors such as a path that cannot be read or written) are printed
on one line and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rlmlab.errors import RlmlabError

# Subcommand modules, in the order `rlmlab --help` lists them.
COMMANDS = ("demo", "run", "report", "export", "reproduce", "view", "trace", "data", "train", "eval", "probe", "frames")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlmlab", description="Recursive language models vs CoT on "
                                     "symbolic expression evaluation.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"rlmlab.cli.{name}_cmd").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if sys.stdout is None:  # started with standard output closed (`rlmlab ... >&-`)
        if sys.stderr is not None:
            print(f"rlmlab {args.command}: error: standard output is closed", file=sys.stderr)
        return 2
    try:
        return int(args.handler(args) or 0)
    except BrokenPipeError:  # `rlmlab ... | head`; an OSError, so caught before it
        return 0
    except RlmlabError as e:
        print(f"rlmlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path that is a folder, unwritable, a full disk: the OS names it
        where = f"{e.filename}: " if e.filename else ""
        print(f"rlmlab {args.command}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlmlab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

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


# An error line echoes at most this much (a 10 MB expression must not make a 10 MB line).
MAX_ERROR_CHARS = 600


class UsageError(Exception):
    """A command line argparse refuses; `main` prints it on one line."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line and a pointer to --help instead of the usage dump."""

    def error(self, message: str):
        raise UsageError(self.prog, message)


def one_line(message: str) -> str:
    """`message` on one line, cut to `MAX_ERROR_CHARS`."""
    flat = " ".join(str(message).split("\n"))
    return flat if len(flat) <= MAX_ERROR_CHARS else f"{flat[:MAX_ERROR_CHARS]}... ({len(flat):,} characters)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rlmlab", description="Recursive language models vs CoT on "
                                     "symbolic expression evaluation.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"rlmlab.cli.{name}_cmd").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        print(f"{e.prog}: error: {one_line(str(e))} (see {e.prog} --help)", file=sys.stderr)
        return 2
    if sys.stdout is None:  # started with standard output closed (`rlmlab ... >&-`)
        if sys.stderr is not None:
            print(f"rlmlab {args.command}: error: standard output is closed", file=sys.stderr)
        return 2
    try:
        return int(args.handler(args) or 0)
    except BrokenPipeError:  # `rlmlab ... | head`; an OSError, so caught before it
        return 0
    except RlmlabError as e:
        print(f"rlmlab {args.command}: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # a path that is a folder, unwritable, a full disk: the OS names it
        where = f"{e.filename}: " if e.filename else ""
        print(f"rlmlab {args.command}: error: {one_line(f'{where}{e.strerror or e}')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlmlab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

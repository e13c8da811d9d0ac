"""`rlmlab` command line: thin entry points over the library.

Each subcommand lives in its own module with `register(subparsers)`; user errors
(`RlmlabError`, and OS errors such as a path that cannot be read or written) are printed
on one line and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import io
import sys
from importlib.metadata import PackageNotFoundError, version

from rlmlab.errors import ConfigError, RlmlabError

# Subcommands (module rlmlab.cli.<name>_cmd each), in the order `rlmlab --help` lists them, with
# the line it shows (the same as the module's own; a test keeps them equal). Only the module of
# the command being run is imported, so that `rlmlab --help` and light commands answer at once.
COMMANDS = {
    "demo": "RM vs CoT on the paper's length split with the released checkpoints (a few minutes)",
    "run": "run one of the paper's experiments end to end",
    "report": "tables (Markdown, LaTeX) and figures (PNG, PDF) of an experiment folder",
    "export": "copy an experiment's results (no checkpoints or data files) and rebuild its report there",
    "convert": "rewrite a results folder's records as Parquet, in today's encoding",
    "reproduce": "check a committed results folder against a fresh run",
    "view": "static HTML pages of an evaluation or experiment folder",
    "trace": "print the canonical trace and active frames of expressions",
    "task": "check a task file and describe the task",
    "data": "build data sets",
    "train": "train a CoT or RM model",
    "eval": "decode an expression set greedily and score it",
    "probe": "measure a model's non-invariance under the active-frame map",
    "frames": "teacher-forced errors per active frame, seen vs unseen in training",
}


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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or, given `command`, of that one in full and the others
    by name and help line only."""
    parser = Parser(prog="rlmlab", description="Recursive language models vs CoT on "
                    "symbolic expression evaluation.")
    parser.add_argument("--version", action="version", version=f"rlmlab {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, line in COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(f"rlmlab.cli.{name}_cmd").register(sub)
        else:
            sub.add_parser(name, help=line)
    return parser


def _version() -> str:
    try:
        return version("rlmlab")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand parser that `args` went through (`rlmlab data pool` -> pool's)."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name not in (subs[0].choices if subs else {}):
            return parser
        parser = subs[0].choices[name]


def unknown_options_error(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> None:
    """Exit (status 2) naming the arguments the command does not take, with the closest option
    it does take for each mistyped one (`--model.n_layr=3` -> `--model.n_layer`)."""
    cmd = _command_parser(parser, args)
    options = [o for a in cmd._actions if a.help != argparse.SUPPRESS for o in a.option_strings if o.startswith("--")]
    by_key = {"--" + o.rpartition(".")[2]: o for o in options if "." in o}  # --lr -> --train.lr
    hints = []
    for arg in extra:
        flag = arg.partition("=")[0]
        if not flag.startswith("--"):
            continue
        close = [by_key[flag]] if flag in by_key else difflib.get_close_matches(flag, options + list(by_key), 1, 0.6)
        if close:
            hints.append(f"{flag}: did you mean {by_key.get(close[0], close[0])}?")
    cmd.error(f"unrecognized arguments: {' '.join(extra)}" + "".join(f"; {h}" for h in hints))


def check_command(argv: list[str]) -> None:
    """Parse a command line as `main` would, without running it: `ConfigError` on one line
    naming what argparse refuses (`rlmlab reproduce` checks its stored commands with it)."""
    command = next((a for a in argv if not a.startswith("-")), "")
    if command not in COMMANDS:
        raise ConfigError(f"unknown command {one_line(repr(command))}")
    parser = build_parser(command)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            args, extra = parser.parse_known_args(argv)
        if extra:
            unknown_options_error(parser, args, extra)
    except UsageError as e:
        raise ConfigError(f"{e.prog}: {one_line(str(e))}") from None
    except SystemExit:  # --help or --version: argparse prints and exits
        raise ConfigError(f"{one_line(' '.join(argv))}: asks for help, runs nothing") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The command is the first argument that is not an option (rlmlab's own are --help, --version).
    command = next((a for a in argv if not a.startswith("-")), "")
    if command and command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, 1, 0.6)
        hint = f"; did you mean {close[0]}?" if close else f"; commands: {', '.join(COMMANDS)}"
        print(f"rlmlab: error: unknown command {one_line(repr(command))}{hint} (see rlmlab --help)", file=sys.stderr)
        return 2
    parser = build_parser(command)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            unknown_options_error(parser, args, extra)
    except UsageError as e:
        print(f"{e.prog}: error: {one_line(str(e))} (see {e.prog} --help)", file=sys.stderr)
        return 2
    if sys.stdout is None:  # started with standard output closed (`rlmlab ... >&-`)
        if sys.stderr is not None:
            print(f"rlmlab {args.command}: error: standard output is closed", file=sys.stderr)
        return 2
    # A command that runs other commands (`rlmlab reproduce`) takes this entry point from here, so
    # that no module below the package imports the package back.
    args.run_command, args.check_command = main, check_command
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

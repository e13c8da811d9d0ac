"""`rlmlab trace EXPR...`: the flattened trace and the active-frame table of the paper's worked example."""

from __future__ import annotations

import json
import sys

from rlmlab.errors import RlmlabError
from rlmlab.task.taskfile import add_task_option, load_task
from rlmlab.task.trace import Execution, execute

BLUE, RED, BOLD, RESET = "\033[34m", "\033[31m", "\033[1m", "\033[0m"


def register(sub) -> None:
    p = sub.add_parser("trace", help="print the canonical trace and active frames of expressions",
                       description="Print the flattened CoT trace and the active-frame (RM) examples. "
                       "Use - to read one expression per line from standard input.")
    p.add_argument("exprs", nargs="+", metavar="EXPR", help="written expression, e.g. 'add(square(2),3)', or -")
    p.add_argument("--json", action="store_true", help="one JSON object per expression, one per line")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    add_task_option(p)
    p.set_defaults(handler=run)


def to_json(ex: Execution) -> dict:
    return {
        "expr": ex.text, "value": ex.value_token, "tokens": list(ex.tokens), "prompt_len": ex.prompt_len,
        "trace_len": ex.trace_len, "max_depth": ex.max_depth, "max_frame_width": ex.max_frame_width,
        "n_frame_examples": ex.n_frame_examples,
        "frames": [{"depth": f.depth, "m": f.m, "tokens": list(f.tokens)} for f in ex.frames],
    }


def render(ex: Execution, color: bool) -> str:
    b, r, bold, z = (BLUE, RED, BOLD, RESET) if color else ("", "", "", "")
    ctrl = {"<call>", "</call>", "<return>", "</return>"}

    def paint(toks, base=""):
        return " ".join(f"{r}{t}{z}{base}" if color and t in ctrl else t for t in toks)

    lines = [f"{bold}{ex.text}{z} = {ex.value_token}   trace {ex.trace_len} tokens, max depth "
             f"{ex.max_depth}, {ex.n_frame_examples} active-frame examples, widest {ex.max_frame_width}",
             "", f"{bold}(A) flattened trace (what CoT reads){z}",
             paint(ex.tokens[:ex.prompt_len]) + " " + paint(ex.tokens[ex.prompt_len:]),
             "", f"{bold}(B) active frames (what RM reads): context | targets{z}"]
    for i, f in enumerate(ex.frames, 1):
        ctx = f"{b}{paint(f.context, b)}{z}" if color else paint(f.context)
        lines.append(f"F{i:<3} d={f.depth:<2} m={f.m:<3} {ctx} | {paint(f.targets)}")
    return "\n".join(lines)


class BinaryInput(RlmlabError):
    """Standard input that is not text: reported once, not once per line."""


def _inputs(exprs: list[str]):
    for e in exprs:
        if e == "-":
            stream = getattr(sys.stdin, "buffer", sys.stdin)
            for n, line in enumerate(stream, 1):
                if isinstance(line, bytes):
                    try:
                        line = line.decode("utf-8")
                    except UnicodeDecodeError:
                        line = "\0"
                if "\0" in line:
                    raise BinaryInput(f"standard input, line {n}: not text (binary input?)")
                if line.strip():
                    yield line.strip()
        else:
            yield e


def run(args) -> int:
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    library = load_task(args.task).library
    failed = 0
    first = True
    inputs = _inputs(args.exprs)
    while True:
        try:
            text = next(inputs, None)
            if text is None:
                break
            ex = execute(text, library)
        except BinaryInput as e:
            print(f"rlmlab trace: error: {e}", file=sys.stderr)
            return 2
        except RlmlabError as e:
            print(f"rlmlab trace: error: {e}", file=sys.stderr)
            failed += 1
            continue
        if args.json:
            print(json.dumps(to_json(ex)))
        else:
            print(("" if first else "\n") + render(ex, color))
        first = False
    return 2 if failed else 0

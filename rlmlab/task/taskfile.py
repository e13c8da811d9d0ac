"""The task as data: modulus, function library and generator settings, read from a TOML file
(docs/tasks.md) or built in, with an identity (the digest of its canonical form) that data,
run configs, checkpoints and experiment folders record.

A command resolves its task once (`--task`, or what its data, checkpoint or experiment folder
records) and passes the `Task` down; parsing, execution and the vocabulary are its methods, and
nothing below falls back to the paper's task on its own.

    load_task(None | "paper")          the paper's task, built in (`--task`'s default)
    load_task("mod7")                  a task shipped in rlmlab/tasks/
    load_task("my_task.toml")          a task file
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from pathlib import Path

from rlmlab.errors import LibraryError, TaskError
from rlmlab.task.expr import _LEX as _EXPR_LEX
from rlmlab.task.expr import Call, Expr, evaluate, infer_type, parse
from rlmlab.task.expr import to_text as expr_text
from rlmlab.task.library import MAX_FUNCTIONS, PAPER_LIBRARY, FunctionDef, Library
from rlmlab.task.rules import RuleError, parse_rule
from rlmlab.task.rules import to_text as rule_text
from rlmlab.task.sampler import ExpressionSampler, GeneratorConfig
from rlmlab.task.trace import Execution, TraceStats, execute, trace_stats
from rlmlab.task.vocab import Vocab

FORMAT = "rlmlab.task/1"
PAPER = "paper"
TASKS_DIR = Path(__file__).resolve().parent.parent / "tasks"
MAX_FILE_BYTES = 1 << 20
MAX_LEVEL = 10
"""Deepest nesting bound a task file may set: the generator's expressions grow exponentially with it."""
PAPER_DESCRIPTION = ("The paper's task: mod-10 arithmetic over 21 typed functions (11 primitives, "
                     "7 composites, 3 tail recursions), generator p_lit = 0.4, nesting bound 3.")

_TOP_KEYS = {"task", "generator", "function"}
_TASK_KEYS = {"name", "description", "modulus"}
_GEN_KEYS = {"p_lit", "max_level", "roots"}
_FN_KEYS = {"name", "kind", "params", "types", "returns", "lazy", "rule", "body"}


@dataclass(frozen=True, eq=False)
class Task:
    """Everything that defines the task: its library (functions and modulus) and its generator.

    Two tasks are the same task when their canonical forms agree (`digest`); the name, the
    description and the file's layout do not enter it."""

    name: str
    """A label for messages and reports."""
    library: Library
    """The functions, over the digits 0..modulus-1."""
    generator: GeneratorConfig = GeneratorConfig()
    """Literal probability and nesting bound of the expression generator."""
    root_weights: tuple[float, ...] | None = None
    """Weight of each function (library order) as the root of a generated expression; None: uniform."""
    description: str = ""
    source: str = "built-in"
    """Where it was read from (a file path, or built-in)."""

    @property
    def modulus(self) -> int:
        return self.library.modulus

    @cached_property
    def canonical(self) -> dict:
        """The task as plain data, independent of spacing, comments and key order in its file."""
        functions = []
        for fn in self.library:
            d = {"name": fn.name, "kind": fn.kind, "params": list(fn.params + fn.lazy),
                 "types": list(fn.arg_types), "returns": fn.return_type}
            if fn.kind == "primitive":
                if fn.rule is None:
                    raise TaskError(f"primitive {fn.name!r} has no rule: a task's primitives are written as rules")
                d["rule"] = rule_text(parse_rule(fn.rule))
                d["lazy"] = list(fn.lazy)
            else:
                d["body"] = expr_text(self.library.bodies[fn.name])
            functions.append(d)
        roots = None if self.root_weights is None else [[f.name, float(w)]
                                                        for f, w in zip(self.library, self.root_weights)]
        return {"format": FORMAT, "modulus": self.modulus, "functions": functions,
                "generator": {"p_lit": float(self.generator.p_lit), "max_level": self.generator.max_level,
                              "roots": roots}}

    @cached_property
    def digest(self) -> str:
        """SHA-256 of the canonical form: the task's identity."""
        text = json.dumps(self.canonical, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def spec(self) -> str:
        """What `load_task` takes to load this task again: a built-in name or the file's path."""
        if self.source == "built-in" or self.source in builtin_tasks():
            return self.name if self.source == "built-in" else self.source
        return str(Path(self.source).resolve())

    @property
    def short(self) -> str:
        return self.digest[:12]

    @property
    def identity(self) -> dict:
        """What data, configs, checkpoints and experiment folders record about their task."""
        return {"name": self.name, "digest": self.digest}

    @property
    def is_paper(self) -> bool:
        return self.digest == paper_task().digest

    @cached_property
    def vocab(self) -> Vocab:
        return Vocab.from_library(self.library)

    def parse(self, text: str, check_types: bool = True) -> Expr:
        """A written expression of this task, type-checked; ExprError names what is wrong."""
        return parse(text, self.library, check_types=check_types)

    def execute(self, expr: Expr | str) -> Execution:
        """The canonical trace of an expression (a `Call` or its written form)."""
        return execute(expr, self.library)

    def trace_stats(self, expr: Call) -> TraceStats:
        return trace_stats(expr, self.library)

    def evaluate(self, expr: Expr) -> int | bool:
        return evaluate(expr, self.library)

    def infer_type(self, expr: Expr) -> str:
        return infer_type(expr, self.library)

    def sampler(self, config: GeneratorConfig | None = None, roots: list[str] | None = None) -> ExpressionSampler:
        """The task's generator (`config` overrides its literal probability and nesting bound;
        `roots` restricts the root to those functions, uniformly)."""
        weights = None
        if roots is None and self.root_weights is not None:
            roots, weights = [f.name for f in self.library], list(self.root_weights)
        return ExpressionSampler(self.library, config or self.generator, roots=roots, weights=weights)

    def __eq__(self, other) -> bool:
        return isinstance(other, Task) and self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"Task({self.name!r}, modulus={self.modulus}, {len(self.library)} functions, {self.short})"

    def describe(self) -> str:
        return f"task {self.name!r} ({self.short})"

    def to_toml(self) -> str:
        """The task as a task file (canonical rules and bodies, no comments)."""
        c = self.canonical
        lines = ["[task]", f"name = {json.dumps(self.name)}"]
        if self.description:
            lines.append(f"description = {json.dumps(self.description)}")
        lines += [f"modulus = {c['modulus']}", "", "[generator]", f"p_lit = {c['generator']['p_lit']!r}",
                  f"max_level = {c['generator']['max_level']}"]
        if c["generator"]["roots"] is not None:
            lines.append("roots = { " + ", ".join(f"{n} = {w!r}" for n, w in c["generator"]["roots"]) + " }")
        for f in c["functions"]:
            lines += ["", "[[function]]", f"name = {json.dumps(f['name'])}", f"kind = {json.dumps(f['kind'])}",
                      f"params = {json.dumps(f['params'])}", f"types = {json.dumps(f['types'])}",
                      f"returns = {json.dumps(f['returns'])}"]
            if f.get("lazy"):
                lines.append(f"lazy = {json.dumps(f['lazy'])}")
            key = "rule" if "rule" in f else "body"
            lines.append(f"{key} = {json.dumps(f[key])}")
        return "\n".join(lines) + "\n"


@lru_cache(maxsize=1)
def paper_task() -> Task:
    """The paper's task, built in (rlmlab/tasks/paper.toml is the same task as a file)."""
    return Task(PAPER, PAPER_LIBRARY, GeneratorConfig(), None, PAPER_DESCRIPTION)


def builtin_tasks() -> list[str]:
    """Names `--task` accepts besides a file path."""
    return sorted({PAPER} | {p.stem for p in TASKS_DIR.glob("*.toml")})


def load_task(spec: "str | Path | Task | None" = None) -> Task:
    """A task from a built-in name, a task file path, or a Task (returned as is); None is the paper's."""
    if isinstance(spec, Task):
        return spec
    if spec is None or spec == PAPER:
        return paper_task()
    if not isinstance(spec, (str, Path)) or not str(spec).strip():
        raise TaskError(f"--task: expected a built-in task name or a task file, got {spec!r}")
    path = Path(spec)
    if not path.exists() and isinstance(spec, str) and "/" not in spec and not spec.endswith(".toml"):
        if (TASKS_DIR / f"{spec}.toml").exists():
            return replace(_load_file(TASKS_DIR / f"{spec}.toml"), source=spec)
        raise TaskError(f"--task {spec}: no such task file, and no built-in task of that name "
                        f"(built-in: {', '.join(builtin_tasks())})")
    return _load_file(path)


def _load_file(path: Path) -> Task:
    try:
        if path.is_dir():
            raise TaskError(f"{path}: is a folder, not a task file")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TaskError(f"{path}: no such task file") from None
    except OSError as e:
        raise TaskError(f"{path}: cannot read it ({e.strerror or type(e).__name__})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise TaskError(f"{path}: larger than {MAX_FILE_BYTES} bytes; not a task file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TaskError(f"{path}: not UTF-8 text") from None
    return task_from_toml(text, str(path))


def task_from_toml(text: str, source: str = "<task>") -> Task:
    """Parse and check a task file's text; any problem is one TaskError line naming `source`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{source}: not valid TOML ({_one_line(str(e))})") from None
    except RecursionError:
        raise TaskError(f"{source}: not valid TOML (nested too deeply)") from None
    try:
        return task_from_dict(data, source)
    except (LibraryError, TaskError) as e:
        raise TaskError(f"{source}: {_one_line(str(e))}") from None


def task_from_dict(data: dict, source: str = "<task>") -> Task:
    """A task from the structure of a task file (what `tomllib` returns)."""
    if not isinstance(data, dict):
        raise TaskError("a task file is a TOML table")
    _no_other_keys(data, _TOP_KEYS, "the file")
    head = _table(data.get("task", {}), "[task]")
    _no_other_keys(head, _TASK_KEYS, "[task]")
    name = head.get("name", Path(source).stem if source != "<task>" else "task")
    if not isinstance(name, str) or not name.strip() or len(name) > 100 or "\n" in name:
        raise TaskError("[task] name must be a one-line string of at most 100 characters")
    description = head.get("description", "")
    if not isinstance(description, str):
        raise TaskError("[task] description must be a string")
    modulus = head.get("modulus")
    if modulus is None:
        raise TaskError("[task] needs a modulus (the digits are 0..modulus-1)")
    if not _is_int(modulus):
        raise TaskError(f"[task] modulus must be an integer, got {modulus!r}")
    specs = data.get("function")
    if not isinstance(specs, list) or not specs:
        raise TaskError("no functions: write each as a [[function]] table")
    if len(specs) > MAX_FUNCTIONS:
        raise TaskError(f"more than {MAX_FUNCTIONS} functions")
    functions = [_function(spec, i) for i, spec in enumerate(specs)]
    library = Library(functions, modulus)
    gen = _table(data.get("generator", {}), "[generator]")
    _no_other_keys(gen, _GEN_KEYS, "[generator]")
    p_lit = gen.get("p_lit", GeneratorConfig.p_lit)
    if isinstance(p_lit, bool) or not isinstance(p_lit, (int, float)) or not 0.0 <= p_lit <= 1.0:
        raise TaskError(f"[generator] p_lit must be a number from 0 to 1, got {p_lit!r}")
    max_level = gen.get("max_level", GeneratorConfig.max_level)
    if not _is_int(max_level) or not 1 <= max_level <= MAX_LEVEL:
        raise TaskError(f"[generator] max_level must be an integer from 1 to {MAX_LEVEL}, got {max_level!r}")
    weights = None
    roots = gen.get("roots", "uniform")
    if roots != "uniform":
        if not isinstance(roots, dict) or not roots:
            raise TaskError("[generator] roots must be \"uniform\" or a table of weights, e.g. { add = 2, sub = 1 }")
        unknown = [r for r in roots if r not in library]
        if unknown:
            raise TaskError(f"[generator] roots: unknown function {unknown[0]!r}")
        for r, w in roots.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0 or w > 1e9:
                raise TaskError(f"[generator] roots: weight of {r!r} must be a number from 0 to 1e9, got {w!r}")
        weights = tuple(float(roots.get(f.name, 0.0)) for f in library)
        if not sum(weights) > 0:
            raise TaskError("[generator] roots: every weight is zero")
    task = Task(name.strip(), library, GeneratorConfig(float(p_lit), max_level), weights, description, source)
    task.canonical  # noqa: B018 - a rule that cannot be written canonically fails here, not later
    return task


def _function(spec, i: int) -> FunctionDef:
    if not isinstance(spec, dict):
        raise TaskError(f"function {i + 1}: a [[function]] must be a table")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise TaskError(f"function {i + 1}: needs a name")
    where = f"function {name!r}"
    _no_other_keys(spec, _FN_KEYS, where)
    params = spec.get("params")
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise TaskError(f"{where}: params must be a list of names")
    types = spec.get("types", ["int"] * len(params))
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types) or len(types) != len(params):
        raise TaskError(f"{where}: types must list one type per parameter (int, bool or T)")
    returns = spec.get("returns", "int")
    if not isinstance(returns, str):
        raise TaskError(f"{where}: returns must be a type (int, bool or T)")
    lazy = spec.get("lazy", [])
    if not isinstance(lazy, list) or not all(isinstance(p, str) for p in lazy):
        raise TaskError(f"{where}: lazy must be a list of parameter names")
    unknown = [p for p in lazy if p not in params]
    if unknown:
        raise TaskError(f"{where}: lazy names {unknown[0]!r}, which is not a parameter")
    n_strict = len(params) - len(lazy)
    if lazy and params[n_strict:] != lazy:
        raise TaskError(f"{where}: lazy parameters must be the last ones, in order")
    rule, body = spec.get("rule"), spec.get("body")
    if (rule is None) == (body is None):
        raise TaskError(f"{where}: give either a rule (a primitive) or a body (a defined function)")
    for key, value in (("rule", rule), ("body", body)):
        if value is not None and not isinstance(value, str):
            raise TaskError(f"{where}: {key} must be a string")
    if rule is not None:
        kind = "primitive"
    else:
        kind = "recursive" if name in {m.group(1) for m in _EXPR_LEX.finditer(body) if m.group(1)} else "composite"
    declared = spec.get("kind", kind)
    if declared not in ("primitive", "composite", "recursive"):
        raise TaskError(f"{where}: kind must be primitive, composite or recursive, got {declared!r}")
    if declared != kind:
        raise TaskError(f"{where}: declared {declared}, but its " + ("rule makes it a primitive" if rule is not None
                        else "body " + ("calls itself" if kind == "recursive" else "never calls itself")))
    if rule is not None:
        try:
            parse_rule(rule)  # syntax first, so that the message shows the rule
        except RuleError as e:
            raise TaskError(f"rule of {name!r}: {e}") from None
    return FunctionDef(name, tuple(params[:n_strict]), tuple(types), returns, kind, body=body, rule=rule,
                       lazy=tuple(lazy))


def _table(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise TaskError(f"{where} must be a table")
    return value


def _no_other_keys(d: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise TaskError(f"{where}: unknown key {extra[0]!r} (allowed: {', '.join(sorted(allowed))})")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _one_line(s: str) -> str:
    return " ".join(s.split())[:500]


def add_task_option(parser) -> None:
    """`--task NAME|FILE` on an argparse (sub)parser."""
    parser.add_argument("--task", default=None, metavar="NAME|FILE",
                        help="the task: a task file (docs/tasks.md) or a built-in name "
                             f"({', '.join(builtin_tasks())}); default: paper")


def task_of_meta(identity, what: str) -> str:
    """The digest recorded in a file's or folder's task identity; a missing one is the paper's
    task (everything written before tasks were recorded). Raises TaskError on a malformed one."""
    if identity is None:
        return paper_task().digest
    if not isinstance(identity, dict) or not isinstance(identity.get("digest"), str):
        raise TaskError(f"{what}: malformed task identity (expected {{'name': ..., 'digest': ...}})")
    return identity["digest"]


def check_same_task(identity, task: Task, what: str) -> None:
    """Refuse `what` (data, a checkpoint, a folder) when it was made for another task than `task`."""
    digest = task_of_meta(identity, what)
    if digest != task.digest:
        name = identity.get("name", "?") if isinstance(identity, dict) else PAPER
        raise TaskError(f"{what} belongs to task {name!r} ({digest[:12]}), not to {task.describe()}; "
                        "pass the matching --task, or use data and runs of one task")

"""A typed function library over the digits 0..M-1, as data; the paper's (M = 10) is `PAPER_LIBRARY`.

Every function is one `FunctionDef` in a `Library`. Primitives carry a rule in the rule
language (`rlmlab.task.rules`), evaluated once per input when the library is built and kept as
a table; composite and tail-recursive functions carry their body in the written form, parsed
and type-checked when the library is built. A library is refused (LibraryError naming the
function) unless it is well posed: every type checks, every name is known, every rule stays in
0..M-1, no function calls itself except a tail-recursive one in tail position, and every tail
recursion reaches its base case within `MAX_RECURSION` self-calls from every input, and no
function's calls nest more than `MAX_CALL_DEPTH` frames deep.

Types are "int", "bool", or "T" (a type variable, for lazily evaluated arguments and the
result a primitive chooses among them, as `if_then_else` does).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Callable, Literal

from rlmlab.errors import LibraryError
from rlmlab.task.expr import ANY, BOOL, BOOLS, INT, Call, evaluate, infer_type, literal_value, parse, value_token
from rlmlab.task.rules import KEYWORDS, Lazy, RuleError, check_rule, eval_rule, parse_rule

Kind = Literal["primitive", "composite", "recursive"]
TYPES = (INT, BOOL, ANY)
MAX_MODULUS = 100
"""Digit literals are tokens of their own; a larger modulus would swamp the vocabulary."""
MAX_RECURSION = 100
"""A tail-recursive function must reach its base case within this many self-calls from every input."""
MAX_CALL_DEPTH = 100
"""Frames a call of any one function may open below it, bounded from its body and its recursion's
steps (the paper's deepest, accum_sum and fibonacci, reach 21). Keeps traces within the drivers' default
depth limit and the recursive executors far from Python's recursion limit."""
MAX_CHECKED_INPUTS = 100_000
"""Rules and tail recursions are checked on every input; a function with more inputs is refused."""
MAX_FUNCTIONS = 200
MAX_ARITY = 8
RESERVED = frozenset({"True", "False", "return"})
"""Identifier-like tokens of the trace grammar that no function or parameter may be named."""


@dataclass(frozen=True)
class FunctionDef:
    """One library function.

    `params` are the names of the arguments bound before the body runs, written into traces
    (`p := v`); `lazy` names the arguments after them, which a primitive's rule may choose as
    the call's continuation and which are evaluated only when chosen (the branches of
    `if_then_else`). `arg_types` covers both, strict first.
    """

    name: str
    params: tuple[str, ...]
    arg_types: tuple[str, ...]
    return_type: str
    kind: Kind
    body: str | None = None
    impl: Callable[..., int | bool | Lazy] | None = field(default=None, compare=False, repr=False)
    rule: str | None = None
    lazy: tuple[str, ...] = ()

    @property
    def arity(self) -> int:
        return len(self.arg_types)

    @property
    def bound(self) -> int:
        return len(self.params)


class _Table:
    """A primitive's rule tabulated over every input: picklable, and a dict lookup per call."""

    def __init__(self, table: dict[tuple, int | bool | Lazy]):
        self.table = table

    def __call__(self, *args):
        return self.table[args]


def _prim(name, params, arg_types, ret, rule, lazy=()) -> FunctionDef:
    return FunctionDef(name, tuple(params), tuple(arg_types), ret, "primitive", rule=rule, lazy=tuple(lazy))


def _def(name, params, ret, body, kind: Kind = "composite") -> FunctionDef:
    return FunctionDef(name, tuple(params), (INT,) * len(params), ret, kind, body=body)


PAPER_FUNCTIONS: tuple[FunctionDef, ...] = (
    _prim("add", "xy", (INT, INT), INT, "(x + y) % M"),
    _prim("sub", "xy", (INT, INT), INT, "(x - y) % M"),
    _prim("multiply", "xy", (INT, INT), INT, "(x * y) % M"),
    _prim("diff", "xy", (INT, INT), INT, "abs(x - y) % M"),
    _prim("square", "x", (INT,), INT, "(x * x) % M"),
    _prim("double", "x", (INT,), INT, "(2 * x) % M"),
    _prim("min", "xy", (INT, INT), INT, "min(x, y)"),
    _prim("max", "xy", (INT, INT), INT, "max(x, y)"),
    _prim("less", "xy", (INT, INT), BOOL, "x < y"),
    _prim("is_even", "x", (INT,), BOOL, "x % 2 == 0"),
    # The branches are lazy: only the chosen one is ever evaluated.
    _prim("if_then_else", ("c",), (BOOL, ANY, ANY), ANY, "if c then a else b", lazy=("a", "b")),
    _def("triple_add", ("a", "b", "c"), INT, "add(add(a,b),c)"),
    _def("sum_of_squares", ("a", "b"), INT, "add(square(a),square(b))"),
    _def("diff_of_squares", ("a", "b"), INT, "sub(square(a),square(b))"),
    _def("clamp", ("v", "l", "u"), INT, "min(max(v,l),u)"),
    _def("manhattan", ("x1", "y1", "x2", "y2"), INT, "add(diff(x1,x2),diff(y1,y2))"),
    _def("is_in_range", ("v", "l", "u"), BOOL, "less(sub(v,l),sub(u,l))"),
    _def("point_in_rect", ("x", "y", "x1", "y1", "x2", "y2"), BOOL,
         "if_then_else(is_in_range(x,x1,x2),is_in_range(y,y1,y2),False)"),
    _def("accum_sum", ("n", "acc"), INT,
         "if_then_else(less(n,1),acc,accum_sum(sub(n,1),add(acc,n)))", "recursive"),
    _def("factorial", ("n", "acc"), INT,
         "if_then_else(less(n,2),acc,factorial(sub(n,1),multiply(acc,n)))", "recursive"),
    _def("fibonacci", ("n", "a", "b"), INT,
         "if_then_else(less(n,1),a,fibonacci(sub(n,1),b,add(a,b)))", "recursive"),
)


class Library:
    """An ordered registry of functions over the digits 0..`modulus`-1, checked to be well posed
    on construction (see the module docstring)."""

    def __init__(self, functions: tuple[FunctionDef, ...] | list[FunctionDef], modulus: int = 10):
        if isinstance(modulus, bool) or not isinstance(modulus, int) or not 2 <= modulus <= MAX_MODULUS:
            raise LibraryError(f"modulus must be an integer from 2 to {MAX_MODULUS}, got {modulus!r}")
        self.modulus = modulus
        self.digits: tuple[str, ...] = tuple(str(d) for d in range(modulus))
        self.literals = frozenset(self.digits + BOOLS)
        if not functions:
            raise LibraryError("a library needs at least one function")
        if len(functions) > MAX_FUNCTIONS:
            raise LibraryError(f"more than {MAX_FUNCTIONS} functions")
        self.functions: dict[str, FunctionDef] = {}
        for fn in functions:
            self._check_signature(fn)
            if fn.name in self.functions:
                raise LibraryError(f"function {fn.name!r} defined twice")
            self.functions[fn.name] = fn
        self.param_names: tuple[str, ...] = tuple(
            dict.fromkeys(p for fn in self.functions.values() for p in fn.params))
        clash = sorted(set(self.param_names) & set(self.functions))
        if clash:
            owner = next(f.name for f in self.functions.values() if clash[0] in f.params)
            raise LibraryError(f"function {owner!r}: parameter {clash[0]!r} is also a function's name "
                               "(one token cannot mean both)")
        for name, fn in list(self.functions.items()):
            if fn.kind == "primitive" and fn.impl is None:
                self.functions[name] = _with_table(fn, modulus)
        self.bodies: dict[str, Call] = {}
        for fn in self.functions.values():
            if fn.body is None:
                continue
            env = dict(zip(fn.params, fn.arg_types))
            try:
                body = parse(fn.body, self, params=env)
                got = infer_type(body, self, env)
            except Exception as e:  # noqa: BLE001 - re-raised with the function named
                raise LibraryError(f"body of {fn.name!r}: {e}") from None
            if not isinstance(body, Call):
                raise LibraryError(f"body of {fn.name!r} must be a call")
            if got != fn.return_type:
                raise LibraryError(f"body of {fn.name!r} has type {got}, declared {fn.return_type}")
            self.bodies[fn.name] = body
        self._check_calls()

    # -- construction checks --

    def _check_signature(self, fn: FunctionDef) -> None:
        name = fn.name
        if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
            raise LibraryError(f"function name {name!r} is not an identifier")
        if name in RESERVED:
            raise LibraryError(f"function {name!r}: the name is a token of the trace grammar")
        where = f"function {name!r}"
        if fn.kind not in ("primitive", "composite", "recursive"):
            raise LibraryError(f"{where}: kind {fn.kind!r} is not primitive, composite or recursive")
        if not 1 <= fn.arity <= MAX_ARITY:
            raise LibraryError(f"{where}: takes 1 to {MAX_ARITY} arguments, has {fn.arity}")
        names = fn.params + fn.lazy
        if len(names) != fn.arity:
            raise LibraryError(f"{where}: {len(names)} parameter names for {fn.arity} argument types")
        if len(set(names)) != len(names):
            raise LibraryError(f"{where}: a parameter name is used twice")
        for p in names:
            if not isinstance(p, str) or not p.isidentifier() or not p.isascii():
                raise LibraryError(f"{where}: parameter name {p!r} is not an identifier")
            if p in RESERVED or (fn.kind == "primitive" and p in KEYWORDS):
                raise LibraryError(f"{where}: parameter name {p!r} is reserved")
        bad = [t for t in fn.arg_types + (fn.return_type,) if t not in TYPES]
        if bad:
            raise LibraryError(f"{where}: unknown type {bad[0]!r} (types: int, bool, T)")
        strict, lazy = fn.arg_types[:fn.bound], fn.arg_types[fn.bound:]
        if ANY in strict:
            raise LibraryError(f"{where}: the type variable T is for lazy arguments only")
        if fn.return_type == ANY and ANY not in lazy:
            raise LibraryError(f"{where}: returns T but has no lazy argument of type T")
        if fn.kind == "primitive":
            if fn.body is not None:
                raise LibraryError(f"primitive {name!r} must not have a body")
            if fn.rule is None and fn.impl is None:
                raise LibraryError(f"primitive {name!r} needs a rule")
            if not fn.params:
                raise LibraryError(f"{where}: needs at least one argument evaluated before the rule")
        else:
            if fn.body is None:
                raise LibraryError(f"{fn.kind} function {name!r} needs a body")
            if fn.rule is not None or fn.impl is not None:
                raise LibraryError(f"{fn.kind} function {name!r} has a body, not a rule")
            if fn.lazy:
                raise LibraryError(f"{where}: only primitives take lazy arguments (every argument "
                                   "of a defined function is bound)")

    def _check_calls(self) -> None:
        """No call cycles but a recursive function's own tail calls; every tail recursion ends."""
        calls = {name: _called(body) for name, body in self.bodies.items()}
        for name, fn in self.functions.items():
            if fn.kind == "recursive" and name not in calls[name]:
                raise LibraryError(f"function {name!r} is declared recursive but never calls itself")
            if fn.kind == "composite" and name in calls.get(name, ()):
                raise LibraryError(f"function {name!r} calls itself: declare it recursive")
        order: list[str] = []
        state: dict[str, int] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                cycle = path[path.index(name):]
                raise LibraryError(f"function {cycle[0]!r}: calls cycle through {' -> '.join(cycle + [name])}")
            state[name] = 1
            for callee in sorted(calls.get(name, ())):
                if callee != name:
                    visit(callee, path + [name])
            state[name] = 2
            order.append(name)

        for name in self.functions:
            visit(name, [])
        self.max_call_depth: dict[str, int] = {}
        for name in order:  # callees first: their own recursions and depths are known by then
            fn = self.functions[name]
            steps = self._check_tail_recursion(name) if fn.kind == "recursive" else 0
            if fn.kind == "primitive":
                depth = 1
            else:
                body = self.bodies[name]
                depth = 1 + self._depth(body, name) + steps * self._tail_frames(body, name)
            if depth > MAX_CALL_DEPTH:
                raise LibraryError(f"function {name!r}: its calls can nest {depth} frames deep, more than "
                                   f"{MAX_CALL_DEPTH}" + (f" ({steps} recursive calls)" if steps else ""))
            self.max_call_depth[name] = depth

    def _depth(self, e, name: str) -> int:
        """Frames below a frame that evaluates `e` (in `name`'s body), the self-calls' own aside."""
        if isinstance(e, str):
            return 0
        below = max((self._depth(a, name) for a in e.args), default=0)
        if e.fn == name:
            return below
        if self.functions[e.fn].kind == "primitive":
            return 1 + below
        return max(1 + below, self.max_call_depth[e.fn])

    def _tail_frames(self, e, name: str) -> int:
        """Frames from a frame of `name` down to its next frame, along the tail position."""
        if isinstance(e, str):
            return 0
        if e.fn == name:
            return 1
        g = self.functions[e.fn]
        if g.kind != "primitive" or not g.lazy:
            return 0
        return 1 + max(self._tail_frames(a, name) for a in e.args[g.bound:])

    def _check_tail_recursion(self, name: str) -> int:
        """Check that `name` recurses in tail position only and ends from every input; returns
        the most recursive calls it makes from one."""
        fn = self.functions[name]
        body = self.bodies[name]

        def tail_ok(e, tail: bool) -> None:
            if isinstance(e, str):
                return
            if e.fn == name and not tail:
                raise LibraryError(f"function {name!r}: calls itself outside tail position "
                                   "(only tail recursion is allowed)")
            g = self.functions[e.fn]
            for i, a in enumerate(e.args):
                tail_ok(a, tail and e.fn != name and g.kind == "primitive" and i >= g.bound)

        tail_ok(body, True)
        domains = [self._domain(t) for t in fn.arg_types]
        if _count_inputs(domains) > MAX_CHECKED_INPUTS:
            raise LibraryError(f"function {name!r}: more than {MAX_CHECKED_INPUTS} inputs to check "
                               "for termination (fewer arguments, or a smaller modulus)")
        steps: dict[tuple, int] = {}  # self-calls until the base case, per input
        for start in itertools.product(*domains):
            chain: list[tuple] = []
            on_chain: set[tuple] = set()
            args = start
            while args not in steps:
                if args in on_chain:
                    raise LibraryError(f"function {name!r}: never reaches its base case from "
                                       f"{_show(name, start)}")
                if len(chain) > MAX_RECURSION:
                    raise LibraryError(f"function {name!r}: more than {MAX_RECURSION} recursive calls "
                                       f"from {_show(name, start)}")
                chain.append(args)
                on_chain.add(args)
                nxt = self._tail_step(name, body, args)
                if nxt is None:
                    steps[chain.pop()] = 0
                    break
                args = nxt
            n = steps[args]
            for a in reversed(chain):
                n += 1
                steps[a] = n
            if steps[start] > MAX_RECURSION:
                raise LibraryError(f"function {name!r}: more than {MAX_RECURSION} recursive calls "
                                   f"from {_show(name, start)}")
        return max(steps.values())

    def _tail_step(self, name: str, body: Call, args: tuple) -> tuple | None:
        """The arguments of the self-call that `name(*args)` makes, or None at a base case."""
        env = dict(zip(self.functions[name].params, args))
        e = body
        while isinstance(e, Call):  # walk the tail position down to a value or the self-call
            if e.fn == name:
                return tuple(self._value(a, env) for a in e.args)
            g = self.functions[e.fn]
            if g.kind != "primitive" or not g.lazy:
                return None
            r = g.impl(*(self._value(a, env) for a in e.args[:g.bound]))
            if not isinstance(r, Lazy):
                return None
            e = e.args[r.index]
        return None

    def _value(self, e, env: dict):
        """The value of a body expression with its parameters bound to the values `env`."""
        if isinstance(e, str):
            return env[e] if e in env else literal_value(e)
        g = self.functions[e.fn]
        vals = [self._value(a, env) for a in e.args[:g.bound]]
        if g.impl is not None:
            v = g.impl(*vals)
            return self._value(e.args[v.index], env) if type(v) is Lazy else v
        return evaluate(Call(e.fn, tuple(map(value_token, vals))), self)

    def _domain(self, type_: str) -> tuple:
        return (False, True) if type_ == BOOL else tuple(range(self.modulus))

    # -- lookup --

    def __getitem__(self, name: str) -> FunctionDef:
        return self.functions[name]

    def __contains__(self, name: str) -> bool:
        return name in self.functions

    def __iter__(self):
        return iter(self.functions.values())

    def __len__(self) -> int:
        return len(self.functions)

    def returning(self, type_: str) -> list[str]:
        """Names of the functions that can return `type_` (`if_then_else` returns either)."""
        return [f.name for f in self if f.return_type in (type_, ANY)]


def _called(e) -> set[str]:
    if isinstance(e, str):
        return set()
    return {e.fn}.union(*(_called(a) for a in e.args))


def _count_inputs(domains) -> int:
    n = 1
    for d in domains:
        n *= len(d)
    return n


def _show(name: str, args: tuple) -> str:
    return f"{name}({','.join(map(str, args))})"


def _with_table(fn: FunctionDef, modulus: int) -> FunctionDef:
    """`fn` with its rule parsed, type-checked and tabulated over every input of its strict
    arguments; a rule that fails on an input, or leaves 0..M-1, is refused naming the input."""
    where = f"rule of {fn.name!r}"
    try:
        rule = parse_rule(fn.rule)
        env = dict(zip(fn.params, fn.arg_types))
        lazy_types = dict(zip(fn.lazy, fn.arg_types[fn.bound:]))
        got = check_rule(rule, env, lazy_types)
    except RuleError as e:
        raise LibraryError(f"{where}: {e}") from None
    if got != fn.return_type:
        raise LibraryError(f"{where} gives {got}, declared {fn.return_type}")
    domains = [(False, True) if t == BOOL else tuple(range(modulus)) for t in fn.arg_types[:fn.bound]]
    if _count_inputs(domains) > MAX_CHECKED_INPUTS:
        raise LibraryError(f"{where}: more than {MAX_CHECKED_INPUTS} inputs to check")
    lazy_index = {p: fn.bound + i for i, p in enumerate(fn.lazy)}
    table = {}
    for args in itertools.product(*domains):
        try:
            v = eval_rule(rule, dict(zip(fn.params, args)), lazy_index, modulus)
        except ZeroDivisionError:
            raise LibraryError(f"{where} divides by zero at {_show(fn.name, args)}") from None
        if isinstance(v, bool) or isinstance(v, Lazy):
            pass
        elif not 0 <= v < modulus:
            raise LibraryError(f"{where} gives {v} at {_show(fn.name, args)}, outside 0..{modulus - 1}")
        table[args] = v
    return replace(fn, impl=_Table(table))


PAPER_LIBRARY = Library(PAPER_FUNCTIONS)

"""The typed mod-10 function library of the paper, as data.

Every function is one `FunctionDef` in a `Library`. Primitives carry a Python
implementation; composite and tail-recursive functions carry their body in the
written form, which is parsed and type-checked when the library is built.
Adding a composite is one entry in `PAPER_FUNCTIONS`.

Types are "int", "bool", or "T" (the type variable of `if_then_else`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

from rlmlab.errors import LibraryError
from rlmlab.task.expr import ANY, BOOL, INT, Call, infer_type, parse, set_default_library

Kind = Literal["primitive", "composite", "recursive"]


@dataclass(frozen=True)
class FunctionDef:
    """One library function.

    `params` are the parameter names written into traces (`p := v`). For
    `if_then_else` only the condition is bound, so `params == ("c",)` while
    `arg_types` has three entries; `bound` says how many leading arguments are
    bound before the body runs.
    """

    name: str
    params: tuple[str, ...]
    arg_types: tuple[str, ...]
    return_type: str
    kind: Kind
    body: str | None = None
    impl: Callable[..., int | bool] | None = field(default=None, compare=False, repr=False)

    @property
    def arity(self) -> int:
        return len(self.arg_types)

    @property
    def bound(self) -> int:
        return len(self.params)


def _prim(name, params, arg_types, ret, impl) -> FunctionDef:
    return FunctionDef(name, tuple(params), tuple(arg_types), ret, "primitive", impl=impl)


def _def(name, params, ret, body, kind: Kind = "composite") -> FunctionDef:
    return FunctionDef(name, tuple(params), (INT,) * len(params), ret, kind, body=body)


PAPER_FUNCTIONS: tuple[FunctionDef, ...] = (
    _prim("add", "xy", (INT, INT), INT, lambda x, y: (x + y) % 10),
    _prim("sub", "xy", (INT, INT), INT, lambda x, y: (x - y) % 10),
    _prim("multiply", "xy", (INT, INT), INT, lambda x, y: (x * y) % 10),
    _prim("diff", "xy", (INT, INT), INT, lambda x, y: abs(x - y) % 10),
    _prim("square", "x", (INT,), INT, lambda x: (x * x) % 10),
    _prim("double", "x", (INT,), INT, lambda x: (2 * x) % 10),
    _prim("min", "xy", (INT, INT), INT, min),
    _prim("max", "xy", (INT, INT), INT, max),
    _prim("less", "xy", (INT, INT), BOOL, lambda x, y: x < y),
    _prim("is_even", "x", (INT,), BOOL, lambda x: x % 2 == 0),
    # Branches are not bound: only the chosen one is ever evaluated.
    FunctionDef("if_then_else", ("c",), (BOOL, ANY, ANY), ANY, "primitive"),
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
    """An ordered registry of functions whose bodies are parsed and type-checked on construction."""

    def __init__(self, functions: tuple[FunctionDef, ...] | list[FunctionDef]):
        self.functions: dict[str, FunctionDef] = {}
        for fn in functions:
            if fn.name in self.functions:
                raise LibraryError(f"function {fn.name!r} defined twice")
            if not fn.name.isidentifier():
                raise LibraryError(f"function name {fn.name!r} is not an identifier")
            if fn.kind == "primitive" and fn.body is not None:
                raise LibraryError(f"primitive {fn.name!r} must not have a body")
            if fn.kind != "primitive" and fn.body is None:
                raise LibraryError(f"{fn.kind} function {fn.name!r} needs a body")
            if fn.kind != "primitive" and len(fn.params) != fn.arity:
                raise LibraryError(f"{fn.name!r}: every argument of a defined function is bound")
            self.functions[fn.name] = fn
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
        self.param_names: tuple[str, ...] = tuple(
            dict.fromkeys(p for fn in self.functions.values() for p in fn.params))

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


PAPER_LIBRARY = Library(PAPER_FUNCTIONS)
set_default_library(PAPER_LIBRARY)

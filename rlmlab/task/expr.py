"""Expressions: parse, print, type-check and evaluate the written form.

An expression is a `Call(fn, args)` whose arguments are expressions or leaves;
a leaf is a literal token (a digit `"0"`..`"M-1"` of the library's modulus M, `"True"`,
`"False"`) or, inside a library body only, a parameter name. Plain tuples and strings keep expressions
hashable and cheap, which the pool builder relies on (it memoises per sub-call).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol, Union

from rlmlab.errors import ExprError
from rlmlab.task.rules import Lazy

INT, BOOL, ANY = "int", "bool", "T"  # ANY: the type variable of if_then_else

DIGITS = tuple(str(d) for d in range(10))  # the paper's (M = 10); a library holds its own
BOOLS = ("True", "False")
# Written calls nest at most this deep. The paper's deepest bins are ~25 calls; the bound
# keeps the recursive parser, printer and executor far from Python's recursion limit.
MAX_NESTING = 100


class Call(NamedTuple):
    fn: str
    args: tuple["Expr", ...]


Expr = Union[Call, str]


class Signature(Protocol):
    """What parsing, type-checking and evaluating read of one library function
    (`rlmlab.task.library.FunctionDef`)."""

    name: str
    params: tuple[str, ...]
    arg_types: tuple[str, ...]
    return_type: str
    impl: Callable[..., int | bool | Lazy] | None

    @property
    def arity(self) -> int: ...

    @property
    def bound(self) -> int: ...


class Signatures(Protocol):
    """What parsing, type-checking and evaluating read of a library (`rlmlab.task.library.Library`):
    its literals and modulus, its functions by name, and the bodies of its composite ones."""

    literals: frozenset[str]
    modulus: int
    bodies: Mapping[str, Expr]

    def __contains__(self, name: str) -> bool: ...

    def __getitem__(self, name: str) -> Signature: ...


def literal_type(tok: str) -> str:
    return BOOL if tok in BOOLS else INT


def literal_value(tok: str) -> int | bool:
    if tok in BOOLS:
        return tok == "True"
    return int(tok)


def value_token(v: int | bool) -> str:
    """The trace token of a value: `str` already prints True/False and digits."""
    return str(v)


# --- printing ---------------------------------------------------------------

def tokens(e: Expr) -> list[str]:
    """Whitespace tokens of the written form: `add ( 2 , 3 )`."""
    out: list[str] = []
    _tokens_into(e, out)
    return out


def _tokens_into(e: Expr, out: list[str]) -> None:
    if isinstance(e, str):
        out.append(e)
        return
    out.append(e.fn)
    out.append("(")
    for i, a in enumerate(e.args):
        if i:
            out.append(",")
        _tokens_into(a, out)
    out.append(")")


def to_text(e: Expr) -> str:
    """The compact written form: `add(square(2),3)`."""
    if isinstance(e, str):
        return e
    return f"{e.fn}({','.join(to_text(a) for a in e.args)})"


def size(e: Expr) -> int:
    """Number of tokens of the written form."""
    if isinstance(e, str):
        return 1
    return 2 + len(e.args) + sum(size(a) for a in e.args)  # name ( args, commas )


# --- parsing ----------------------------------------------------------------

_LEX = re.compile(r"\s*(?:([A-Za-z_][A-Za-z_0-9]*)|(\d+)|([(),]))")


def _lex(text: str) -> list[tuple[str, int]]:
    toks, i = [], 0
    while i < len(text):
        m = _LEX.match(text, i)
        if m is None or m.end() == i:
            if text[i:].strip() == "":
                break
            j = i + len(text[i:]) - len(text[i:].lstrip())
            raise ExprError(f"unexpected character {text[j]!r}", j, text)
        tok = m.group(1) or m.group(2) or m.group(3)
        toks.append((tok, m.start(m.lastindex)))
        i = m.end()
    return toks


def parse(text: str, library: Signatures, params: dict[str, str] | None = None,
          check_types: bool = True) -> Expr:
    """Parse a written expression (spaces optional) and type-check it.

    `params` maps parameter names to types; they are allowed as leaves only when given
    (library bodies). Raises `ExprError` naming the position and the problem.
    """
    toks = _lex(text)
    if not toks:
        raise ExprError("empty expression", 0, text)
    pos = 0
    nesting = 0

    def at(k: int) -> int:
        return toks[k][1] if k < len(toks) else len(text)

    def expr() -> Expr:
        nonlocal pos, nesting
        if pos >= len(toks):
            raise ExprError("expression ends early", len(text), text)
        tok, where = toks[pos]
        pos += 1
        if tok.isdigit():
            if tok not in library.literals:
                raise ExprError(f"literal {tok} is not a digit 0-{library.modulus - 1}", where, text)
            return tok
        if tok in BOOLS:
            return tok
        if tok in "(),":
            raise ExprError(f"stray {tok!r}", where, text)
        if params is not None and tok in params:
            return tok
        if tok not in library:
            raise ExprError(f"unknown function {tok!r}", where, text)
        fn = library[tok]
        if pos >= len(toks) or toks[pos][0] != "(":
            raise ExprError(f"expected '(' after {tok!r}", at(pos), text)
        nesting += 1
        if nesting > MAX_NESTING:
            raise ExprError(f"calls nested more than {MAX_NESTING} deep", where, text)
        pos += 1
        args: list[Expr] = []
        if pos < len(toks) and toks[pos][0] == ")":
            pos += 1
        else:
            while True:
                args.append(expr())
                if pos >= len(toks):
                    raise ExprError(f"missing ')' to close {tok!r}", len(text), text)
                sep, spos = toks[pos]
                pos += 1
                if sep == ")":
                    break
                if sep != ",":
                    raise ExprError(f"expected ',' or ')' but found {sep!r}", spos, text)
        if len(args) != fn.arity:
            raise ExprError(f"{tok} takes {fn.arity} argument{'s' * (fn.arity != 1)}, got {len(args)}",
                            where, text)
        nesting -= 1
        return Call(tok, tuple(args))

    e = expr()
    if pos < len(toks):
        raise ExprError(f"stray token {toks[pos][0]!r} after the expression", toks[pos][1], text)
    if check_types:
        _check(e, library, params or {}, text, toks)
    return e


def _check(e: Expr, library: Signatures, env: dict[str, str], text: str, toks) -> None:
    """Type-check with positions: walk the tokens alongside the tree to name the column."""
    counter = iter(range(len(toks)))

    def walk(node: Expr) -> tuple[str, int]:
        k = next(counter)
        where = toks[k][1]
        if isinstance(node, str):
            return (env[node] if node in env else literal_type(node)), where
        fn = library[node.fn]
        next(counter)  # "("
        got = []
        for i, a in enumerate(node.args):
            if i:
                next(counter)  # ","
            got.append(walk(a))
        next(counter)  # ")"
        tvar = None
        for want, (have, apos) in zip(fn.arg_types, got):
            if want == ANY:
                if tvar is None:
                    tvar = have
                elif have != tvar:
                    raise ExprError(f"{node.fn} branches differ: {tvar} and {have}", apos, text)
            elif have != want:
                raise ExprError(f"{have} where {want} is expected (argument of {node.fn})", apos, text)
        return (tvar if fn.return_type == ANY else fn.return_type), where

    walk(e)


def infer_type(e: Expr, library: Signatures, env: dict[str, str] | None = None) -> str:
    """Type of a well-formed expression ("int" or "bool")."""
    if isinstance(e, str):
        if env and e in env:
            return env[e]
        return literal_type(e)
    fn = library[e.fn]
    if fn.return_type == ANY:
        return infer_type(e.args[fn.arg_types.index(ANY)], library, env)
    return fn.return_type


def substitute(e: Expr, binding: dict[str, str]) -> Expr:
    """Replace parameter leaves by their bound literal tokens."""
    if isinstance(e, str):
        return binding.get(e, e)
    return Call(e.fn, tuple(substitute(a, binding) for a in e.args))


def evaluate(e: Expr, library: Signatures) -> int | bool:
    """Direct (non-tracing) evaluator: the reference the executor is tested against."""
    if isinstance(e, str):
        return literal_value(e)
    fn = library[e.fn]
    vals = [evaluate(a, library) for a in e.args[:fn.bound]]  # lazy arguments wait to be chosen
    if fn.impl is not None:
        v = fn.impl(*vals)
        return evaluate(e.args[v.index], library) if type(v) is Lazy else v
    body = substitute(library.bodies[fn.name], dict(zip(fn.params, map(value_token, vals))))
    return evaluate(body, library)

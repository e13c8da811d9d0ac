"""The rule language of primitive functions: a small arithmetic and boolean language, parsed and
evaluated here (never by Python's `eval`), so that a task file holds data and no code.

    rule    := 'if' rule 'then' rule 'else' rule | or
    or      := and ('or' and)*
    and     := not ('and' not)*
    not     := 'not' not | compare
    compare := sum (('<' | '<=' | '>' | '>=' | '==' | '!=') sum)?
    sum     := product (('+' | '-') product)*
    product := unary (('*' | '//' | '%') unary)*
    unary   := '-' unary | atom
    atom    := INTEGER | 'True' | 'False' | 'M' | NAME | ('abs' | 'min' | 'max') '(' rule (',' rule)* ')'
             | '(' rule ')'

`M` is the task's modulus; `//` and `%` floor as in Python (so `(x - y) % M` is in 0..M-1);
NAME is a parameter of the function. A lazily evaluated parameter (as the branches of
`if_then_else`) may only be the rule's result, directly or as a branch of `if`: the rule then
chooses which argument expression the call continues with, and that argument is evaluated only
when chosen.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Union

MAX_RULE_CHARS = 1000
MAX_RULE_DEPTH = 32  # nested sub-rules; keeps parsing and evaluation far from Python's recursion limit
KEYWORDS = frozenset({"if", "then", "else", "and", "or", "not", "True", "False", "M", "abs", "min", "max"})
_FUNCS = {"abs": (1, 1), "min": (2, 8), "max": (2, 8)}
_CMP = ("<=", ">=", "==", "!=", "<", ">")
_LEX = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z_0-9]*)|(<=|>=|==|!=|//|[-+*%<>(),]))", re.ASCII)


class RuleError(ValueError):
    """A rule that does not parse or type-check (the caller names the function)."""


class Num(NamedTuple):
    value: int


class Bool(NamedTuple):
    value: bool


class Name(NamedTuple):
    name: str  # a parameter, or "M"


class Op(NamedTuple):
    op: str  # + - * // % < <= > >= == != and or not neg abs min max
    args: tuple["Rule", ...]


class If(NamedTuple):
    cond: "Rule"
    then: "Rule"
    other: "Rule"


Rule = Union[Num, Bool, Name, Op, If]


class Lazy(NamedTuple):
    """A rule's result that is not a value: the call continues with its argument `index`."""

    index: int


def parse_rule(text: str) -> Rule:
    if not isinstance(text, str):
        raise RuleError("a rule is a string")
    if len(text) > MAX_RULE_CHARS:
        raise RuleError(f"rule longer than {MAX_RULE_CHARS} characters")
    toks: list[str] = []
    i = 0
    while i < len(text):
        m = _LEX.match(text, i)
        if m is None:
            if text[i:].strip() == "":
                break
            j = i + len(text[i:]) - len(text[i:].lstrip())
            raise RuleError(f"unexpected character {text[j]!r} in rule {text!r}")
        toks.append(m.group(m.lastindex))
        i = m.end()
    if not toks:
        raise RuleError("empty rule")
    pos = 0
    depth = 0

    def peek() -> str | None:
        return toks[pos] if pos < len(toks) else None

    def take(want: str | None = None) -> str:
        nonlocal pos
        if pos >= len(toks):
            raise RuleError(f"rule {text!r} ends early" + (f" (expected {want!r})" if want else ""))
        tok = toks[pos]
        if want is not None and tok != want:
            raise RuleError(f"expected {want!r} but found {tok!r} in rule {text!r}")
        pos += 1
        return tok

    def nested(f):
        def g():
            nonlocal depth
            depth += 1
            if depth > MAX_RULE_DEPTH:
                raise RuleError(f"rule nested more than {MAX_RULE_DEPTH} deep")
            try:
                return f()
            finally:
                depth -= 1
        return g

    @nested
    def rule() -> Rule:
        if peek() == "if":
            take()
            c = rule()
            take("then")
            a = rule()
            take("else")
            return If(c, a, rule())
        return disj()

    def left_assoc(ops: tuple[str, ...], operand) -> Rule:
        """`operand (op operand)*` for the operators `ops` of one precedence level, left to right."""
        left = operand()
        while peek() in ops:
            op = take()
            left = Op(op, (left, operand()))
        return left

    def disj() -> Rule:
        return left_assoc(("or",), conj)

    def conj() -> Rule:
        return left_assoc(("and",), neg)

    def prefixed(word: str, name: str, operand):
        """The level `word level | operand`: a prefix operator (`not`, unary `-`) applied as `name`."""
        @nested
        def level() -> Rule:
            if peek() == word:
                take()
                return Op(name, (level(),))
            return operand()
        return level

    def compare() -> Rule:
        left = arith()
        if peek() in _CMP:
            op = take()
            left = Op(op, (left, arith()))
            if peek() in _CMP:
                raise RuleError(f"chained comparison in rule {text!r}: use 'and'")
        return left

    def arith() -> Rule:
        return left_assoc(("+", "-"), product)

    def product() -> Rule:
        return left_assoc(("*", "//", "%"), unary)

    def atom() -> Rule:
        tok = take()
        if tok.isdigit():
            if len(tok) > 9:
                raise RuleError(f"integer {tok[:12]}... too large in rule")
            return Num(int(tok))
        if tok in ("True", "False"):
            return Bool(tok == "True")
        if tok == "(":
            r = rule()
            take(")")
            return r
        if tok in _FUNCS:
            lo, hi = _FUNCS[tok]
            take("(")
            args = [rule()]
            while peek() == ",":
                take()
                args.append(rule())
            take(")")
            if not lo <= len(args) <= hi:
                raise RuleError(f"{tok} takes {lo if lo == hi else f'{lo} to {hi}'} argument"
                                f"{'s' * (hi > 1)}, got {len(args)}")
            return Op(tok, tuple(args))
        if tok in KEYWORDS - {"M"} or not (tok[0].isalpha() or tok[0] == "_"):
            raise RuleError(f"unexpected {tok!r} in rule {text!r}")
        return Name(tok)

    neg = prefixed("not", "not", compare)
    unary = prefixed("-", "neg", atom)
    r = rule()
    if pos < len(toks):
        raise RuleError(f"stray {toks[pos]!r} after the rule {text!r}")
    if _depth(r) > MAX_RULE_DEPTH:  # long operator chains nest too (x + x + ... is left-deep)
        raise RuleError(f"rule nested more than {MAX_RULE_DEPTH} deep (split a long chain with parentheses)")
    return r


def _depth(r: Rule) -> int:
    """Depth of the rule's tree, without recursion."""
    deepest, todo = 0, [(r, 1)]
    while todo:
        node, d = todo.pop()
        deepest = max(deepest, d)
        if isinstance(node, Op):
            todo.extend((a, d + 1) for a in node.args)
        elif isinstance(node, If):
            todo.extend(((node.cond, d + 1), (node.then, d + 1), (node.other, d + 1)))
    return deepest


def to_text(r: Rule) -> str:
    """The canonical written form (fully parenthesised where it matters): a task's digest does
    not depend on how its rules were spaced or bracketed."""
    if isinstance(r, Num):
        return str(r.value)
    if isinstance(r, Bool):
        return str(r.value)
    if isinstance(r, Name):
        return r.name
    if isinstance(r, If):
        return f"(if {to_text(r.cond)} then {to_text(r.then)} else {to_text(r.other)})"
    if r.op in _FUNCS:
        return f"{r.op}({', '.join(to_text(a) for a in r.args)})"
    if r.op == "neg":
        return f"(-{to_text(r.args[0])})"
    if r.op == "not":
        return f"(not {to_text(r.args[0])})"
    return f"({to_text(r.args[0])} {r.op} {to_text(r.args[1])})"


_INT_OPS = {"+", "-", "*", "//", "%", "neg", "abs", "min", "max"}
_ORDER = {"<", "<=", ">", ">="}
_LOGIC = {"and", "or", "not"}


def check_rule(r: Rule, env: dict[str, str], lazy: dict[str, str]) -> str:
    """The type of the rule's result ("int", "bool", or a lazy parameter's type), given the
    strict parameters' types `env` and the lazy parameters' types `lazy`. Lazy parameters may
    stand only where the rule's result is chosen."""

    def typ(node: Rule, result: bool) -> str:
        if isinstance(node, Num):
            return "int"
        if isinstance(node, Bool):
            return "bool"
        if isinstance(node, Name):
            if node.name == "M":
                return "int"
            if node.name in lazy:
                if not result:
                    raise RuleError(f"lazy parameter {node.name!r} can only be the rule's result "
                                    "(or a branch of 'if' that is)")
                return lazy[node.name]
            if node.name not in env:
                raise RuleError(f"unknown name {node.name!r} in the rule")
            return env[node.name]
        if isinstance(node, If):
            if typ(node.cond, False) != "bool":
                raise RuleError("the condition of 'if' must be boolean")
            a, b = typ(node.then, result), typ(node.other, result)
            if a != b:
                raise RuleError(f"the branches of 'if' differ: {a} and {b}")
            return a
        got = [typ(a, False) for a in node.args]
        if node.op in _INT_OPS or node.op in _ORDER:
            if any(g != "int" for g in got):
                raise RuleError(f"'{node.op}' takes integers")
            return "int" if node.op in _INT_OPS else "bool"
        if node.op in _LOGIC:
            if any(g != "bool" for g in got):
                raise RuleError(f"'{node.op}' takes booleans")
            return "bool"
        if got[0] != got[1]:  # == and !=
            raise RuleError(f"'{node.op}' compares {got[0]} with {got[1]}")
        return "bool"

    return typ(r, True)


def eval_rule(r: Rule, values: dict[str, int | bool], lazy: dict[str, int], modulus: int) -> int | bool | Lazy:
    """Evaluate a type-checked rule; `lazy` maps lazy parameter names to their argument index.
    Raises ZeroDivisionError on `// 0` or `% 0` (the caller names the inputs)."""
    if isinstance(r, (Num, Bool)):
        return r.value
    if isinstance(r, Name):
        if r.name == "M":
            return modulus
        if r.name in lazy:
            return Lazy(lazy[r.name])
        return values[r.name]
    if isinstance(r, If):
        return eval_rule(r.then if eval_rule(r.cond, values, lazy, modulus) else r.other, values, lazy, modulus)
    op = r.op
    if op == "and":
        return bool(eval_rule(r.args[0], values, lazy, modulus)) and bool(eval_rule(r.args[1], values, lazy, modulus))
    if op == "or":
        return bool(eval_rule(r.args[0], values, lazy, modulus)) or bool(eval_rule(r.args[1], values, lazy, modulus))
    a = [eval_rule(x, values, lazy, modulus) for x in r.args]
    if op == "not":
        return not a[0]
    if op == "neg":
        return -a[0]
    if op == "abs":
        return abs(a[0])
    if op == "min":
        return min(a)
    if op == "max":
        return max(a)
    x, y = a
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if op == "//":
        return x // y
    if op == "%":
        return x % y
    if op == "<":
        return x < y
    if op == "<=":
        return x <= y
    if op == ">":
        return x > y
    if op == ">=":
        return x >= y
    if op == "==":
        return x == y
    return x != y

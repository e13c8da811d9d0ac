"""Parser, printer, type checking and the library registry."""

import re

import pytest

from rlmlab.errors import ExprError, LibraryError
from rlmlab.task.expr import Call, evaluate, parse, to_text, tokens
from rlmlab.task.library import PAPER_FUNCTIONS, PAPER_LIBRARY, FunctionDef, Library
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def test_library_has_the_papers_21_functions():
    kinds = [f.kind for f in PAPER_LIBRARY]
    assert len(PAPER_LIBRARY) == 21
    assert (kinds.count("primitive"), kinds.count("composite"), kinds.count("recursive")) == (11, 7, 3)
    assert PAPER_LIBRARY.bodies["sum_of_squares"] == parse("add(square(a),square(b))",
                                                           params={"a": "int", "b": "int"}, library=PAPER.library)


def test_new_composite_is_one_entry():
    lib = Library(PAPER_FUNCTIONS + (FunctionDef("cube", ("x",), ("int",), "int", "composite",
                                                  body="multiply(x,square(x))"),))
    assert evaluate(parse("cube(3)", lib), lib) == 7


@pytest.mark.parametrize("body, msg", [
    ("add(x,less(x,1))", "bool where int"),
    ("nope(x)", "unknown function"),
    ("add(x,y)", "unknown function 'y'"),
    ("less(x,1)", "has type bool"),
])
def test_bad_bodies_fail_when_the_library_loads(body, msg):
    with pytest.raises(LibraryError, match=msg):
        Library(PAPER_FUNCTIONS + (FunctionDef("bad", ("x",), ("int",), "int", "composite", body=body),))


@pytest.mark.parametrize("text, col, msg", [
    ("foo(1)", 1, "unknown function 'foo'"),
    ("add(2)", 1, "add takes 2 arguments, got 1"),
    ("add(True,2)", 5, "bool where int is expected"),
    ("is_even(less(1,2))", 9, "bool where int is expected"),
    ("add(2,3))", 9, "stray token ')'"),
    ("add(2,,3)", 7, "stray ','"),
    ("add(2 3)", 7, "expected ',' or ')'"),
    ("add(2,3", 8, "missing ')'"),
    ("add(12,3)", 5, "not a digit"),
    ("if_then_else(True,1,False)", 21, "branches differ"),
    ("add(2,$)", 7, "unexpected character"),
    ("", 1, "empty expression"),
    ("x", 1, "unknown function 'x'"),
])
def test_parse_errors_name_position_and_problem(text, col, msg):
    with pytest.raises(ExprError, match=re.escape(msg)) as info:
        PAPER.parse(text)
    assert info.value.pos == col - 1
    assert "\n" not in str(info.value)


def test_spaces_optional_and_token_form_accepted():
    a = PAPER.parse("add(square(2),3)")
    assert PAPER.parse(" add ( square ( 2 ) , 3 ) ") == a == Call("add", (Call("square", ("2",)), "3"))
    assert PAPER.parse(" ".join(tokens(a))) == a
    assert to_text(a) == "add(square(2),3)"


def test_evaluator_arithmetic():
    cases = {"sub(2,5)": 7, "diff(2,5)": 3, "multiply(7,8)": 6, "square(9)": 1, "double(7)": 4,
             "min(3,8)": 3, "max(3,8)": 8, "less(3,3)": False, "is_even(0)": True,
             "clamp(9,2,5)": 5, "manhattan(1,2,7,9)": 3, "is_in_range(3,2,5)": True,
             "point_in_rect(1,1,0,0,5,5)": True, "accum_sum(9,0)": 5, "factorial(5,1)": 0,
             "fibonacci(7,0,1)": 3, "triple_add(4,5,6)": 5, "diff_of_squares(2,3)": 5}
    for text, want in cases.items():
        assert PAPER.evaluate(PAPER.parse(text)) == want, text

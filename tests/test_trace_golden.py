"""Golden traces: the spec's worked examples, token for token."""

from rlmlab.task.frames import cut_examples
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

WORKED = ("add ( sum_of_squares ( 2 , 3 ) , double ( 4 ) ) x := <call> sum_of_squares ( 2 , 3 ) </call> "
          "a := 2 b := 3 return <return> <call> add ( square ( 2 ) , square ( 3 ) ) </call> "
          "x := <call> square ( 2 ) </call> x := 2 return <return> 4 </return> "
          "y := <call> square ( 3 ) </call> x := 3 return <return> 9 </return> return <return> 3 </return> "
          "</return> y := <call> double ( 4 ) </call> x := 4 return <return> 8 </return> "
          "return <return> 1 </return>").split()

WORKED_FRAMES = [  # (depth, m, context | targets) as printed in the spec
    (1, 14, "add ( sum_of_squares ( 2 , 3 ) , double ( 4 ) ) | x := <call> sum_of_squares ( 2 , 3 ) </call>"),
    (2, 6, "sum_of_squares ( 2 , 3 ) | a := 2 b := 3 return <return> <call> add ( square ( 2 ) , square ( 3 ) ) </call>"),
    (3, 12, "add ( square ( 2 ) , square ( 3 ) ) | x := <call> square ( 2 ) </call>"),
    (4, 4, "square ( 2 ) | x := 2 return <return> 4 </return>"),
    (3, 15, "add ( square ( 2 ) , square ( 3 ) ) x := 4 | y := <call> square ( 3 ) </call>"),
    (4, 4, "square ( 3 ) | x := 3 return <return> 9 </return>"),
    (3, 18, "add ( square ( 2 ) , square ( 3 ) ) x := 4 y := 9 | return <return> 3 </return>"),
    (2, 15, "sum_of_squares ( 2 , 3 ) a := 2 b := 3 return <return> 3 | </return>"),
    (1, 17, "add ( sum_of_squares ( 2 , 3 ) , double ( 4 ) ) x := 3 | y := <call> double ( 4 ) </call>"),
    (2, 4, "double ( 4 ) | x := 4 return <return> 8 </return>"),
    (1, 20, "add ( sum_of_squares ( 2 , 3 ) , double ( 4 ) ) x := 3 y := 8 | return <return> 1 </return>"),
]


def test_worked_example_trace():
    ex = PAPER.execute("add(sum_of_squares(2,3),double(4))")
    assert list(ex.tokens) == WORKED
    assert ex.trace_len == 100 and ex.value == 1 and ex.max_depth == 4 and ex.n_frame_examples == 11
    assert ex.prompt_len == 14


def test_worked_example_frames():
    ex = PAPER.execute("add(sum_of_squares(2,3),double(4))")
    got = [(f.depth, f.m, " ".join(f.context) + " | " + " ".join(f.targets)) for f in ex.frames]
    assert got == WORKED_FRAMES
    assert cut_examples(ex.tokens, ex.prompt_len) == list(ex.frames)


def test_worked_example_stats_fast_path():
    ex = PAPER.execute("add(sum_of_squares(2,3),double(4))")
    s = PAPER.trace_stats(ex.expr)
    assert (s.value, s.trace_len, s.max_depth, s.max_frame_width, s.n_frame_examples) == (1, 100, 4, 28, 11)


def test_figure1_example():
    ex = PAPER.execute("add(square(double(2)),1)")
    assert ex.value == 7
    assert " ".join(ex.tokens) == (
        "add ( square ( double ( 2 ) ) , 1 ) x := <call> square ( double ( 2 ) ) </call> "
        "x := <call> double ( 2 ) </call> x := 2 return <return> 4 </return> "
        "return <return> 6 </return> y := 1 return <return> 7 </return>")
    # Fig. 1(A): the root frame after the call returns reads the value in place of the call
    assert " ".join(ex.frames[-1].context) == "add ( square ( double ( 2 ) ) , 1 ) x := 6"


def test_accum_sum_prefix():
    ex = PAPER.execute("accum_sum(1,0)")
    want = ("accum_sum ( 1 , 0 ) n := 1 acc := 0 return <return> <call> if_then_else ( less ( 1 , 1 ) , 0 , "
            "accum_sum ( sub ( 1 , 1 ) , add ( 0 , 1 ) ) ) </call> c := <call> less ( 1 , 1 ) </call> "
            "x := 1 y := 1 return <return> False </return> return <return> <call> accum_sum ( sub ( 1 , 1 ) , "
            "add ( 0 , 1 ) ) </call> n := <call> sub ( 1 , 1 ) </call>").split()
    assert list(ex.tokens[:len(want)]) == want
    assert ex.value == 1


def test_if_then_else_literal_branch_returns_directly():
    ex = PAPER.execute("if_then_else(less(1,2),5,square(3))")
    assert " ".join(ex.tokens[ex.prompt_len:]) == (
        "c := <call> less ( 1 , 2 ) </call> x := 1 y := 2 return <return> True </return> "
        "return <return> 5 </return>")

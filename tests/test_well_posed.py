"""What RM reads is well posed: the next token is a function of the active frame alone."""

from conftest import sample_expressions

from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def test_identical_active_frames_have_the_same_next_token():
    """Keyed by the whole prefix, hashed token by token from the frame's start, so a prefix is
    compared with every other occurrence of it wherever the context/target split falls."""
    seen_examples: set = set()
    next_token: dict[int, str] = {}
    n_checked = 0
    # 10,000 expressions check over a million target tokens in about 15 s (50,000 took 70 s).
    for e in sample_expressions(10_000, 1):
        for f in PAPER.execute(e).frames:
            key = (f.context, f.targets)
            if key in seen_examples:
                continue
            seen_examples.add(key)
            h = 0
            for t in f.context:
                h = hash((h, t))
            for i, t in enumerate(f.targets):
                prev = next_token.setdefault(h, t)
                assert prev == t, f"frame {f.context + f.targets[:i]} followed by both {prev} and {t}"
                h = hash((h, t))
                n_checked += 1
    assert n_checked > 100_000

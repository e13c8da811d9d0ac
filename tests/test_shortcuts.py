"""Shortcut constructions: S from the trace, the train/OOD coupling, validity checks, the metric."""

import random

import pytest

from rlmlab.errors import ConfigError, DataError
from rlmlab.shortcuts import (
    ABLATIONS,
    CONSTRUCTIONS,
    VARIANTS,
    RootFrame,
    ShortcutConfig,
    ShortcutDataset,
    ShortcutSampler,
    ValidityLimits,
    answer_position,
    build_shortcut_dataset,
    check_identifiable,
    check_no_static_literal,
    check_not_one_to_one,
    child,
    frame_tree,
    get_construction,
    internal_returns,
    root_frame,
    shortcut_rate,
    shortcut_summary,
)
from rlmlab.task.expr import to_text
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

CONFIG = ShortcutConfig()
SIZES = dict(n_train=120, n_val=20, n_iid=30, n_ood=80, config=CONFIG)


class _Built(dict):
    """Constructions and ablations at small size, built on first use (checks recorded, not
    enforced), so no single test pays for all of them."""

    def __missing__(self, name):
        self[name] = build_shortcut_dataset(name, seed=1, check=False, **SIZES)
        return self[name]


@pytest.fixture(scope="module")
def datasets():
    return _Built()


def rows(table):
    return table.to_pylist()


# --- reading the trace ---------------------------------------------------------------

def test_frame_tree_and_internal_returns_on_a_small_trace():
    ex = PAPER.execute("add(accum_sum(2,0),7)")
    tree = frame_tree(ex.tokens, ex.prompt_len)
    assert tree.value == "0" and (tree.start, tree.end) == (11, len(ex.tokens))
    z = child(tree, 0)
    assert z.call == tuple("accum_sum ( 2 , 0 )".split()) and z.value == "3" and (z.start, z.end) == (21, 312)
    assert internal_returns(ex.tokens, z) == [(117, 1), (137, 2), (229, 0), (249, 3), (305, 3)]
    assert [ex.tokens[t] for t, _ in internal_returns(ex.tokens, z)] == ["1", "2", "0", "3", "3"]
    assert answer_position(ex.tokens) == 317 and ex.tokens[317] == "0"
    signals = {name: CONSTRUCTIONS[name].signal(ex.tokens, ex.prompt_len) for name in
               ("long_range_aggregate", "near_answer_aggregate", "position_weighted_aggregate")}
    assert signals == {"long_range_aggregate": "3",          # 1 + 2 + 0
                       "near_answer_aggregate": "6",         # 0 + 3 + 3
                       "position_weighted_aggregate": "9"}   # 229 mod 10
    par = PAPER.execute("is_even(add(accum_sum(2,0),7))")
    assert CONSTRUCTIONS["position_parity"].signal(par.tokens, par.prompt_len) == \
        ("True" if (len(par.tokens) - 2) % 2 == 0 else "False")


def test_frame_tree_matches_every_frame_value_of_random_traces(random_exprs):
    for e in random_exprs[:200]:
        ex = PAPER.execute(e)

        def walk(frame):
            assert frame.value == str(PAPER.evaluate(PAPER.parse(" ".join(frame.call))))
            assert ex.tokens[frame.end - 1] == "</return>"
            for c in frame.children:
                assert frame.start <= c.start < c.end <= frame.end
                walk(c)

        walk(frame_tree(ex.tokens, ex.prompt_len))


# --- the coupling ----------------------------------------------------------------------

@pytest.mark.parametrize("name", [*CONSTRUCTIONS, *VARIANTS, *ABLATIONS])
def test_signal_equals_answer_in_training_and_never_in_ood(datasets, name):
    ds = datasets[name]
    c = get_construction(name)
    assert (ds.train.num_rows, ds.val.num_rows, ds.iid.num_rows, ds.ood.num_rows) == (120, 20, 30, 80)
    for table, coupled in ((ds.train, True), (ds.val, True), (ds.iid, True), (ds.ood, False)):
        for r in rows(table):
            ex = PAPER.execute(r["expr"])
            assert r["signal"] == c.signal(ex.tokens, ex.prompt_len)  # stored S is the trace's S
            assert r["value"] == ex.value_token
            assert (r["signal"] == r["value"]) == coupled, r
            assert r["trace_len"] == ex.trace_len <= CONFIG.max_trace_len
    every = [r["expr"] for t in (ds.train, ds.val, ds.iid, ds.ood) for r in rows(t)]
    assert len(set(every)) == len(every)  # no text twice, within or across sets


@pytest.mark.parametrize("name", ["copy_deep_return", "hidden_literal", "hidden_literal_late",
                                  "long_range_aggregate", "near_answer_aggregate", "position_weighted_aggregate"])
def test_ood_only_resamples_the_compensating_argument(datasets, name):
    """Putting the training value of Y back into an OOD example makes S equal the answer again."""
    c = get_construction(name)
    for r in rows(datasets[name].ood):
        e = PAPER.parse(r["expr"])
        ex = PAPER.execute(e)
        fixed = None
        for y in map(str, range(10)):
            trial = PAPER.execute(e._replace(args=(e.args[0], y)))
            if c.signal(trial.tokens, trial.prompt_len) == trial.value_token:
                fixed = trial
        assert fixed is not None and c.signal(fixed.tokens, fixed.prompt_len) == r["signal"]
        assert fixed.trace_len == ex.trace_len


def test_case1_signal_is_the_deep_return_and_train_y_compensates(datasets):
    for r in rows(datasets["copy_deep_return"].train):
        e = PAPER.parse(r["expr"])
        z = PAPER.evaluate(e.args[0].args[0].args[0])
        assert e.fn == "add" and e.args[0].fn == e.args[0].args[0].fn == "square"
        assert e.args[0].args[0].args[0].fn in ("accum_sum", "factorial", "fibonacci")
        assert r["signal"] == str(z) != "0" and e.args[1] == str((z - z ** 4) % 10)


def test_parity_relationship_is_flipped_on_every_ood_example(datasets):
    ds = datasets["position_parity"]
    for table, flipped in ((ds.train, False), (ds.ood, True)):
        for r in rows(table):
            ex = PAPER.execute(r["expr"])
            even = (len(ex.tokens) - 2) % 2 == 0
            assert ((r["value"] == "True") != even) == flipped
            # the answer position does not depend on the digit Y: only Z fixes S
            e = ex.expr
            other = PAPER.execute(e._replace(args=(e.args[0]._replace(args=(e.args[0].args[0], "5")),)))
            assert other.trace_len == ex.trace_len
    vals = [r["value"] for r in rows(ds.ood)]
    assert 0.3 < vals.count("True") / len(vals) < 0.7


@pytest.mark.parametrize("name,helper_at", [("hidden_literal", 0), ("hidden_literal_late", 1)])
def test_hidden_literal_is_hidden_from_the_root(datasets, name, helper_at):
    ds = datasets[name]
    for table in (ds.train, ds.ood):
        for r in rows(table):
            e = PAPER.parse(r["expr"])
            assert e.args[0].fn == "max" and e.args[0].args[helper_at].fn == "multiply"
            helper = e.args[0].args[helper_at].args[0]
            w = helper.args[1]  # the accumulator argument
            assert helper.fn in ("accum_sum", "factorial", "fibonacci") and not isinstance(w, str)
            k = str(PAPER.evaluate(w))
            assert r["signal"] == k and k not in to_text(w)  # computed, not copied from a literal
            assert e.args[1] != k and PAPER.evaluate(e.args[0]) not in (0, int(k))  # Y and v are not k
            ex = PAPER.execute(e)
            root = root_frame(ex, k)
            assert k not in root.payload  # neither v nor Y shows k to the root frame
            assert k in ex.tokens[ex.prompt_len:]  # but the flat trace does
            # the only difference between the two: whether the helper runs before or after V
            c = get_construction(name)
            tree = frame_tree(ex.tokens, ex.prompt_len)
            h, v = child(tree, *c.h_path), child(tree, *c.v_path)
            assert (h.end <= v.start) if helper_at == 0 else (v.end <= h.start)


# --- validity ------------------------------------------------------------------------

@pytest.mark.parametrize("name", [*CONSTRUCTIONS, *VARIANTS])
def test_the_six_constructions_and_the_variants_pass_the_validity_checks(datasets, name):
    report = datasets[name].report
    assert report["passed"], report


def test_the_checks_reject_the_two_ablations(datasets):
    sib = datasets["sibling_copy"].params["validity"]
    checks = {c["name"]: c for c in sib["checks"]}
    assert not sib["passed"] and not checks["identifiable"]["passed"]
    assert "copy argument 1" in checks["identifiable"]["detail"]
    one = {c["name"]: c for c in datasets["one_to_one_wrapper"].params["validity"]["checks"]}
    assert not one["not_one_to_one"]["passed"] and one["not_one_to_one"]["value"] == 0.0
    for name in ABLATIONS:
        with pytest.raises(DataError, match="invalid shortcut construction"):
            build_shortcut_dataset(name, n_train=60, n_val=5, n_iid=10, n_ood=40, seed=2, config=CONFIG)


def _root(payload, answer, signal, literals=(), fn="add", pos=20):
    return RootFrame(fn, tuple(payload), answer, pos, signal, tuple(literals))


def test_checks_on_hand_made_root_frames():
    limits = ValidityLimits()
    # a root frame that maps to two answers is not identifiable
    bad = [_root(("1", "2"), "3", "3"), _root(("1", "2"), "4", "4")]
    assert not check_identifiable(bad, bad, limits).passed
    # copying argument 0 fits training and OOD alike: harmless
    same = [_root(("5", "0"), "5", "5"), _root(("6", "0"), "6", "6")]
    assert check_identifiable(same, same, limits).passed
    # S a function of the carrier (payload minus the compensating slot): one-to-one code
    coded = [_root((str(3 * z % 10), "0"), str(z), str(z)) for z in range(10)]
    assert not check_not_one_to_one(coded, coded, 1, limits).passed
    assert check_not_one_to_one(coded, coded, 0, limits).passed  # the constant slot says nothing
    # parity-like: S = is_even(payload) in training, flipped in OOD: S is no function of the carrier
    even = {True: "True", False: "False"}
    train = [_root((str(v),), even[v % 2 == 0], even[v % 2 == 0], fn="is_even") for v in range(10)]
    ood = [_root((str(v),), even[v % 2 == 0], even[v % 2 == 1], fn="is_even") for v in range(5)]
    res = check_not_one_to_one(train, ood, None, limits)
    assert res.passed and res.value == 1.0 and "100.0% of OOD" in res.detail
    assert not check_not_one_to_one(train, train[:5], None, limits).passed  # without the flip it is a code
    # S written as a root literal on every example (a hidden literal with Y = k)
    lit = [_root(("0", str(k)), str(k), str(k), [((0, 1), "0"), ((1,), str(k))]) for k in range(10)]
    res = check_no_static_literal(lit, limits)
    assert not res.passed and res.value == 1.0 and "root.arg1" in res.detail
    def matching(m):  # 10 root frames whose literal at root.arg1 equals S on the first m
        return [_root(("0", "0"), str(k), str(k), [((1,), str(k) if k < m else str((k + 1) % 10))])
                for k in range(10)]

    assert check_no_static_literal(matching(4), limits).passed
    assert not check_no_static_literal(matching(5), limits).passed
    with pytest.raises(ConfigError):
        ValidityLimits(copy_fit=1.5)


def test_datasets_are_deterministic_and_roundtrip(datasets, tmp_path, capsys):
    a = datasets["long_range_aggregate"]
    b = build_shortcut_dataset("long_range_aggregate", seed=1, check=False, progress=True, **SIZES)
    assert a.train.equals(b.train) and a.val.equals(b.val) and a.ood.equals(b.ood) and a.iid.equals(b.iid)
    total = sum(v for k, v in SIZES.items() if k.startswith("n_"))  # the bar counts every example of the four sets, and draws nothing itself
    assert f"{total}/{total}" in capsys.readouterr().err
    folder = a.save(tmp_path / "lra")
    c = ShortcutDataset.load(folder)
    assert c.name == a.name and c.params == a.params
    assert c.train.equals(a.train) and c.val.equals(a.val) and c.iid.equals(a.iid) and c.ood.equals(a.ood)
    with pytest.raises(DataError, match="no shortcut.json"):
        ShortcutDataset.load(tmp_path / "missing")


def test_sampler_is_a_function_of_its_rng():
    c = CONSTRUCTIONS["copy_deep_return"]
    draw = [ShortcutSampler(c, random.Random(9)).draw("ood") for _ in range(2)]
    assert to_text(draw[0]) == to_text(draw[1])
    with pytest.raises(ConfigError):
        ShortcutSampler(c, random.Random(9)).draw("test")
    with pytest.raises(ConfigError, match="unknown shortcut construction"):
        get_construction("nope")
    with pytest.raises(ConfigError):
        ShortcutConfig(max_trace_len=0)


# --- the metric -----------------------------------------------------------------------

def test_shortcut_rate_on_hand_made_results():
    results = [
        {"prediction": "3", "signal": "3", "value": "5"},   # follows S
        {"prediction": "5", "signal": "3", "value": "5"},   # correct
        {"prediction": None, "signal": "3", "value": "5"},  # no answer
        {"prediction": "7", "signal": "3", "value": "5"},   # neither
        {"prediction": " True ", "signal": "True", "value": "False"},  # follows S (whitespace ignored)
    ]
    assert shortcut_rate(results) == pytest.approx(2 / 5)
    assert shortcut_summary(results) == {"n": 5, "accuracy": pytest.approx(1 / 5),
                                         "shortcut_rate": pytest.approx(2 / 5)}
    assert shortcut_rate([{"pred": "1", "S": "1"}], prediction_key="pred", signal_key="S") == 1.0
    with pytest.raises(DataError, match="undefined"):
        shortcut_rate([])
    with pytest.raises(DataError, match="lacks the key"):
        shortcut_rate([{"prediction": "1"}])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONSTRUCTIONS))
def test_paper_sized_evaluation_sets_pass_the_checks(name):
    ds = build_shortcut_dataset(name, n_train=3000, n_iid=300, n_ood=300, seed=0)
    assert ds.report["passed"] and ds.ood.num_rows == 300


# --- what a learner reads at the answer (rlmlab/shortcuts/readout.py) ------------------------

class CopiesHiddenLiteral:
    """A predictor that answers the hidden literal k wherever the prefix shows the helper's
    trace, and nothing elsewhere: the shortcut the readout's swap must expose."""

    block_size = None

    def __init__(self, c, vocab):
        self.c, self.vocab = c, vocab

    def reset(self, n_slots):
        pass

    def __call__(self, feeds):
        out = []
        for f in feeds:
            seq = self.vocab.decode(f.seq)
            depth, prompt_len = 0, None
            for i, t in enumerate(seq):  # the written expression ends where its parentheses close
                depth += (t == "(") - (t == ")")
                if t == ")" and depth == 0:
                    prompt_len = i + 1
                    break
            try:  # a complete trace once the answer and its closing token are appended
                k = self.c.signal(list(seq) + ["0", "</return>"], prompt_len)
            except Exception:
                k = None
            out.append(self.vocab.ids[k] if k is not None and len(seq) > prompt_len + 40 else -1)
        return out


@pytest.mark.parametrize("name", ["hidden_literal", "hidden_literal_late"])
def test_readout_tells_the_root_rule_from_the_hidden_literal(datasets, name):
    from rlmlab.decoding.oracle import oracle_predictor
    from rlmlab.shortcuts.readout import readout, readout_summary, split_parts

    vocab, c = PAPER.vocab, get_construction(name)
    ds = datasets[name]
    for part, table in (("iid", ds.iid), ("ood", ds.ood)):
        rs = rows(table)
        for learner in ("cot", "rm"):  # the true rule through either observation keeps the answer
            out = readout(oracle_predictor(learner, vocab, library=PAPER.library), learner, c, rs, vocab)
            s = readout_summary(out)
            swapped = [r for r in out if r["swap_expr"] is not None]
            assert len(swapped) >= len(rs) - 2
            for key in ("in_context_answer", "frame_alone_answer", "frame_agrees", "swapped_answer"):
                assert s[key]["k"] == s[key]["n"], (part, learner, key)
            assert s["swapped_new_signal"]["k"] == 0
            assert s["in_context_signal"]["k"] == (len(rs) if part == "iid" else 0)
            for r in swapped:  # only the helper moved: same V and Y, another k, the same value
                a, b = split_parts(c, PAPER.parse(r["expr"])), split_parts(c, PAPER.parse(r["swap_expr"]))
                assert a[1:] == b[1:] and a[0] != b[0]
                assert r["swap_signal"] not in (r["signal"], r["value"])
                assert str(PAPER.evaluate(PAPER.parse(r["swap_expr"]))) == r["value"]
        out = readout(CopiesHiddenLiteral(c, vocab), "cot", c, rs, vocab)
        s = readout_summary(out)
        assert s["in_context_signal"]["k"] == len(rs)
        assert s["swapped_new_signal"]["k"] == s["swapped_new_signal"]["n"] > 0
        assert s["swapped_answer"]["k"] == 0
        assert s["frame_alone_answer"]["k"] == 0  # the root frame never shows k


def test_readout_refuses_an_expression_of_another_construction(datasets):
    from rlmlab.decoding.oracle import oracle_predictor
    from rlmlab.shortcuts.readout import readout

    vocab = PAPER.vocab
    rs = rows(datasets["long_range_aggregate"].ood)[:3]
    with pytest.raises(DataError, match="not a hidden_literal expression"):
        readout(oracle_predictor("cot", vocab, library=PAPER.library), "cot", get_construction("hidden_literal"), rs, vocab)

"""The task as a file: the paper's task built in and as a file give the golden behaviour recorded
before tasks existed; the invariants hold on every shipped task; a bad task file is one line."""

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlmlab.attention.backends import Dense
from rlmlab.attention.layout import Layout
from rlmlab.cli import main
from rlmlab.decoding.driver import generate
from rlmlab.decoding.oracle import oracle_predictor
from rlmlab.errors import CheckpointError, RlmlabError, TaskError
from rlmlab.learning.checkpoint import load_run, meta_digest
from rlmlab.learning.lanes import lane_pack
from rlmlab.learning.model import Transformer, preset
from rlmlab.measuring.result_files import read_results
from rlmlab.measuring.simulate import lane_tensors, simulate_rm
from rlmlab.task.expr import evaluate, parse, to_text
from rlmlab.task.frames import active_frame, check_prefix, cut_examples
from rlmlab.task.pool import build_pool, read_pool, write_pool
from rlmlab.task.sampler import GeneratorConfig
from rlmlab.task.taskfile import TASKS_DIR, load_task, paper_task, task_from_dict, task_from_toml
from rlmlab.task.trace import execute, trace_stats

PAPER = load_task("paper")

GOLDEN = json.loads((Path(__file__).parent / "golden" / "paper_task.json").read_text())
PAPER_FILE = TASKS_DIR / "paper.toml"
TASKS = ["paper", "mod7"]
RELEASED = Path(__file__).resolve().parent.parent / "rlmlab" / "released" / "paper-cpu-length-595"


def _h(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _before_rename(obj):
    """The golden digests were recorded when the count of active-frame examples was named
    `n_frames`; the values are compared under that name."""
    if isinstance(obj, dict):
        return {("n_frames" if k == "n_frame_examples" else k): v for k, v in obj.items()}
    return obj.replace("n_frame_examples=", "n_frames=")


def _golden_stats(st) -> str:
    """A `TraceStats` as it printed when the digests were recorded: before the rename and before
    the lane fields (checked against the packed examples in test_sweep) were added."""
    return (f"TraceStats(value={st.value!r}, trace_len={st.trace_len!r}, max_depth={st.max_depth!r}, "
            f"max_frame_width={st.max_frame_width!r}, n_frames={st.n_frame_examples!r})")


def _exprs(task, n, seed):
    s, rng = task.sampler(), random.Random(seed)
    return [s.sample(rng) for _ in range(n)]


# --- the paper's task: built in and as a file, exactly today's behaviour ------------------------

@pytest.mark.parametrize("spec", ["paper", str(PAPER_FILE)])
def test_the_papers_task_gives_the_golden_pool_split_traces_and_vocabulary(spec):
    from rlmlab.experiments.splits import iid_split

    task = load_task(spec)
    assert task == paper_task() == load_task(None) and task.digest == paper_task().digest
    assert _h(list(task.vocab.tokens)) == GOLDEN["vocab"]
    pool = build_pool(6000, 42, workers=1, task=task)
    assert _h(_before_rename(pool.to_pydict())) == GOLDEN["pool_rows_6000_s42"]
    sp = iid_split(pool, n_test=500, n_val=100)
    assert _h({k: getattr(sp, k).column("id").to_pylist() for k in ("train", "val", "test")}) == GOLDEN["iid_split"]
    for cfg in (GeneratorConfig(), GeneratorConfig(0.2, 4)):
        s, rng = task.sampler(cfg), random.Random(7)
        rows = []
        for e in (s.sample(rng) for _ in range(400)):
            st_ = trace_stats(e, task.library)
            if st_.trace_len > 3000:
                rows.append([to_text(e), _golden_stats(st_)])
                continue
            ex = execute(e, task.library)
            rows.append([to_text(e), list(ex.tokens), [[f.depth, list(f.context), list(f.targets)] for f in ex.frames],
                         ex.max_depth, str(evaluate(e, task.library)), _golden_stats(st_)])
        assert _h(rows) == GOLDEN[f"traces_p{cfg.p_lit}_l{cfg.max_level}"]


def test_shortcut_sets_are_unchanged_with_tail_recursions_read_from_kinds():
    from rlmlab.shortcuts import TAIL_RECURSIVE, build_shortcut_dataset

    assert TAIL_RECURSIVE == ("accum_sum", "factorial", "fibonacci")
    for name in ("copy_deep_return", "position_parity"):
        ds = build_shortcut_dataset(name, n_train=60, n_val=10, n_iid=10, n_ood=40, check=False)
        assert _h([_before_rename(t.to_pydict()) for t in (ds.train, ds.val, ds.iid, ds.ood)]) == GOLDEN[f"shortcut_{name}"]


def test_the_digest_ignores_layout_and_sees_every_rule():
    text = PAPER_FILE.read_text()
    spaced = text.replace('rule = "(x + y) % M"', 'rule = "( x+y )%M"  # same rule').replace('name = "paper"', 'name = "p2"')
    assert task_from_toml(spaced).digest == paper_task().digest
    changed = text.replace('rule = "(x * y) % M"', 'rule = "(x * y + 1) % M"')
    assert task_from_toml(changed).digest != paper_task().digest
    assert task_from_toml(paper_task().to_toml()).digest == paper_task().digest


# --- invariants on every shipped task -----------------------------------------------------------

@pytest.mark.parametrize("name", TASKS)
def test_trace_grammar_values_frames_and_vocabulary(name):
    task = load_task(name)
    vocab = set(task.vocab.tokens)
    for e in _exprs(task, 300, 1):
        ex = execute(e, task.library)
        assert ex.value == evaluate(e, task.library)
        assert parse(to_text(e), task.library) == e
        s = trace_stats(e, task.library)
        assert (s.trace_len, s.max_depth, s.max_frame_width, s.n_frame_examples) == \
               (ex.trace_len, ex.max_depth, ex.max_frame_width, ex.n_frame_examples)
        assert check_prefix(ex.tokens) is None and set(ex.tokens) <= vocab
        assert cut_examples(ex.tokens, ex.prompt_len) == list(ex.frames)
        assert ex.value_token in task.library.literals


def test_a_task_parses_and_executes_with_its_own_library_only():
    mod7 = load_task("mod7")
    for task in (PAPER, mod7):
        for e in _exprs(task, 50, 2):
            text = to_text(e)
            assert task.parse(text) == parse(text, task.library) == e
            assert task.execute(text).tokens == execute(e, task.library).tokens
            assert task.evaluate(e) == evaluate(e, task.library) == task.execute(e).value
            assert task.trace_stats(e) == trace_stats(e, task.library)
    assert PAPER.evaluate(PAPER.parse("add(8,1)")) == 9
    with pytest.raises(RlmlabError, match="literal 8"):
        mod7.parse("add(8,1)")


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("learner", ["rm", "cot"])
def test_oracle_reproduces_every_trace_through_both_drivers(name, learner):
    task = load_task(name)
    exprs = [e for e in _exprs(task, 200, 2) if trace_stats(e, task.library).trace_len <= 1500]
    gens = generate(oracle_predictor(learner, task.vocab, task.library), exprs, task.vocab, learner, batch_size=64,
                    library=task.library)
    for g, e in zip(gens, exprs):
        ex = execute(e, task.library)
        assert g.valid and tuple(g.tokens) == ex.tokens and g.answer == ex.value_token


@pytest.mark.parametrize("name", TASKS)
def test_lanes_are_exact_and_cot_simulates_rm(name, one_torch_thread):
    task = load_task(name)
    vocab = task.vocab
    torch.manual_seed(0)
    model = Transformer(preset("tiny", "rm", len(vocab))).eval()
    exprs = [e for e in _exprs(task, 60, 3) if trace_stats(e, task.library).trace_len <= 250][:8]
    for ex in (execute(e, task.library) for e in exprs):
        lanes = lane_pack(ex.tokens, ex.prompt_len)
        idx, pos, _ = lane_tensors(lanes, vocab)
        with torch.no_grad():
            packed = model(idx[None], pos[None], Dense(Layout.of_lanes(lanes.frame, lanes.branch)))[0]
        for f, lane_idx in zip(ex.frames, lanes.example_targets):
            with torch.no_grad():
                alone = model(torch.tensor(vocab.encode(f.tokens))[None])[0]
            rows = torch.tensor([f.m + k - 1 for k in range(len(f.targets))])
            assert (packed[torch.tensor(lane_idx) - 1] - alone[rows]).abs().max().item() <= 1e-4
    ex = execute(exprs[0], task.library)
    got = simulate_rm(model, vocab, ex.tokens, ex.prompt_len)
    for t in range(ex.prompt_len, ex.trace_len + 1):
        with torch.no_grad():
            logits = model(torch.tensor(vocab.encode(active_frame(ex.tokens[:t])))[None])[0, -1]
        assert got[t - ex.prompt_len] == vocab.tokens[int(logits.argmax())]


@pytest.mark.parametrize("name", TASKS)
def test_identical_active_frames_have_the_same_next_token(name):
    task = load_task(name)
    next_token: dict = {}
    for e in _exprs(task, 3000, 4):
        for f in execute(e, task.library).frames:
            for i, t in enumerate(f.targets):
                assert next_token.setdefault(f.context + f.targets[:i], t) == t


@pytest.mark.parametrize("name", TASKS)
def test_pools_are_deterministic_and_record_their_task(name, tmp_path):
    task = load_task(name)
    a = build_pool(5000, 9, workers=1, task=task)
    assert a.equals(build_pool(5000, 9, workers=2, task=task))
    path = tmp_path / "p.parquet"
    write_pool(a, path)
    assert read_pool(path, task=task).num_rows == 5000
    other = load_task("mod7" if name == "paper" else "paper")
    with pytest.raises(TaskError, match="belongs to task"):
        read_pool(path, task=other)
    for row in a.slice(0, 100).to_pylist():
        assert execute(row["expr"], task.library).value_token == row["value"]


def test_root_weights_and_the_modulus_shape_the_generator():
    task = load_task("mod7")
    pool = build_pool(8000, 1, workers=1, task=task).to_pylist()
    roots = {}
    for r in pool:
        roots[r["root"]] = roots.get(r["root"], 0) + 1
    assert set(roots) == {f.name for f in task.library}
    assert roots["gcd"] > 1.6 * roots["add"]  # weight 2 against 1
    digits = {t for r in pool for t in parse(r["expr"], task.library).args if isinstance(t, str)}
    assert digits - {"True", "False"} <= {str(d) for d in range(7)}


# --- a bad task file: one line naming the function, exit 2 --------------------------------------

def _with(functions, modulus=7, **extra):
    return {"task": {"modulus": modulus}, "function": functions, **extra}


ADD = {"name": "add", "params": ["x", "y"], "rule": "(x + y) % M"}
LESS = {"name": "less", "params": ["x", "y"], "returns": "bool", "rule": "x < y"}
SUB = {"name": "sub", "params": ["x", "y"], "rule": "(x - y) % M"}
ITE = {"name": "if_then_else", "params": ["c", "a", "b"], "types": ["bool", "T", "T"], "returns": "T",
       "lazy": ["a", "b"], "rule": "if c then a else b"}


@pytest.mark.parametrize("functions, extra, match", [
    ([ADD, LESS, {"name": "f", "params": ["x"], "body": "add(x,less(x,1))"}], {}, "'f'.*bool where int"),
    ([ADD, {"name": "f", "params": ["x"], "body": "nope(x)"}], {}, "'f'.*unknown function 'nope'"),
    ([{"name": "g", "params": ["x"], "rule": "x + z"}], {}, "'g'.*unknown name 'z'"),
    ([{"name": "g", "params": ["x"], "rule": "x < 3"}], {}, "'g' gives bool, declared int"),
    ([{"name": "g", "params": ["x", "y"], "rule": "x + y"}], {}, r"'g' gives 7 at g\(1,6\), outside 0..6"),
    ([{"name": "g", "params": ["x", "y"], "rule": "x // y"}], {}, r"'g' divides by zero at g\(0,0\)"),
    ([ADD, LESS, SUB, ITE, {"name": "f", "params": ["n"], "body": "if_then_else(less(n,1),0,f(n))"}], {},
     r"'f': never reaches its base case from f\(1\)"),
    ([ADD, LESS, SUB, ITE, {"name": "f", "params": ["a", "b"], "body":
      "if_then_else(less(b,1),if_then_else(less(a,1),0,f(sub(a,1),19)),f(a,sub(b,1)))"}], {"modulus": 20},
     "'f': more than 100 recursive calls"),
    ([ADD, LESS, SUB, ITE, {"name": "f", "params": ["n"], "body": "if_then_else(less(n,1),0,f(sub(n,1)))"}],
     {"modulus": 61}, r"'f': its calls can nest 123 frames deep, more than 100 \(60 recursive calls\)"),
    ([ADD, {"name": "f", "params": ["n"], "body": "add(f(n),1)"}], {}, "'f'.*declared composite|'f'.*calls itself"),
    ([ADD, LESS, SUB, ITE, {"name": "f", "params": ["n"], "body": "add(f(sub(n,1)),1)", "kind": "recursive"}], {},
     "'f': calls itself outside tail position"),
    ([ADD, {"name": "f", "params": ["n"], "body": "g(n)"}, {"name": "g", "params": ["n"], "body": "f(n)"}], {},
     "calls cycle through"),
    ([{"name": "True", "params": ["x"], "rule": "x"}], {}, "'True': the name is a token of the trace grammar"),
    ([{"name": "return", "params": ["x"], "rule": "x"}], {}, "'return'"),
    ([{"name": "<call>", "params": ["x"], "rule": "x"}], {}, "not an identifier"),
    ([{"name": "3", "params": ["x"], "rule": "x"}], {}, "not an identifier"),
    ([ADD, {"name": "x", "params": ["y"], "rule": "y"}], {}, "parameter 'x' is also a function's name"),
    ([{"name": "g", "params": ["c", "a"], "types": ["bool", "T"], "returns": "T", "lazy": ["a"],
       "rule": "if c then a + 1 else a"}], {}, "'g'.*lazy parameter 'a' can only be the rule's result"),
    ([{"name": "g", "params": ["x"], "types": ["T"], "returns": "T", "rule": "x"}], {}, "'g'.*T is for lazy"),
    ([{"name": "g", "params": ["x"], "rule": "x" + " + x" * 200 + " % M"}], {}, "'g'.*nested more than 32 deep"),
    ([{"name": "g", "params": ["x"], "rule": "x + \u00b2"}], {}, "'g'.*unexpected character"),
    ([ADD], {"modulus": 1}, "modulus must be an integer from 2"),
    ([ADD, {"name": "f", "params": ["x"], "bodyy": "add(x,1)"}], {}, "'f': unknown key 'bodyy'"),
    ([ADD], {"generator": {"roots": {"sub": 1}}}, "roots: unknown function 'sub'"),
    ([ADD], {"generator": {"p_lit": 2}}, "p_lit must be a number from 0 to 1"),
])
def test_a_bad_task_is_refused_on_one_line_naming_the_problem(functions, extra, match, tmp_path, capsys):
    extra = dict(extra)
    modulus = extra.pop("modulus", 7)
    data = _with(functions, modulus, **extra)
    with pytest.raises(TaskError, match=match) as info:
        task_from_toml(_toml(data), "bad.toml")
    assert "\n" not in str(info.value) and str(info.value).startswith("bad.toml: ")
    path = tmp_path / "bad.toml"
    path.write_text(_toml(data))
    assert main(["trace", "--task", str(path), "add(1,2)"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlmlab trace: error: ")


def _toml(data: dict) -> str:
    """A small TOML writer for the test's tables (strings, numbers, lists, inline tables)."""
    def v(x):
        if isinstance(x, bool):
            return "true" if x else "false"
        if isinstance(x, (int, float)):
            return repr(x)
        if isinstance(x, str):
            return json.dumps(x)
        if isinstance(x, list):
            return "[" + ", ".join(v(i) for i in x) + "]"
        return "{ " + ", ".join(f"{json.dumps(k)} = {v(i)}" for k, i in x.items()) + " }"
    lines = []
    for key in ("task", "generator"):
        if key in data:
            lines.append(f"[{key}]")
            lines += [f"{k} = {v(x)}" for k, x in data[key].items()]
    for f in data.get("function", []):
        lines.append("[[function]]")
        lines += [f"{json.dumps(k)} = {v(x)}" for k, x in f.items()]
    return "\n".join(lines) + "\n"


def test_unknown_task_names_and_missing_files_are_one_line(capsys, tmp_path):
    assert main(["trace", "--task", "nosuch", "add(1,2)"]) == 2
    assert "built-in: mod7, paper" in capsys.readouterr().err
    assert main(["data", "pool", "--task", str(tmp_path / "x.toml"), "--n", "5", "--out", str(tmp_path / "p.parquet"),
                 "--quiet"]) == 2
    assert "no such task file" in capsys.readouterr().err and not (tmp_path / "p.parquet").exists()
    (tmp_path / "t.toml").write_text("[task\nmodulus = 7")
    assert main(["trace", "--task", str(tmp_path / "t.toml"), "add(1,2)"]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_a_task_file_is_never_run_as_python(tmp_path):
    marker = tmp_path / "pwned"
    rule = f"__import__('os').system('touch {marker}')"
    with pytest.raises(TaskError):
        task_from_toml(_toml(_with([{"name": "g", "params": ["x"], "rule": rule}])))
    assert not marker.exists()


# --- fuzz: any text is a task or one line -------------------------------------------------------

_PIECES = ["[[function]]", "[task]", "[generator]", "name", "params", "rule", "body", "lazy", "types", "returns",
           "=", '"', "[", "]", "{", "}", ",", "x", "y", "add", "(", ")", "if", "then", "else", "%", "M", "//",
           "0", "7", "100", "-1", "T", "bool", "int", "\n", " ", "modulus", "kind", "recursive", "less", "f(n)"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_task_files_never_raise_a_traceback(data, tmp_path_factory, capsys):
    text = (TASKS_DIR / "mod7.toml").read_text()
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 40)))
        text = text[:i] + "".join(data.draw(st.lists(st.sampled_from(_PIECES), max_size=6))) + text[j:]
    path = tmp_path_factory.mktemp("fuzz") / "t.toml"
    path.write_text(text)
    try:
        task = task_from_toml(text, "t.toml")
    except RlmlabError as e:
        assert "\n" not in str(e)
        task = None
    rc = main(["trace", "--task", str(path), "add(1,2)"])
    err = capsys.readouterr().err
    if task is None:
        assert rc == 2 and err.count("\n") == 1
    else:
        assert rc in (0, 2) and err.count("\n") <= 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["x", "y", "M", "1", "7", "+", "-", "*", "//", "%", "(", ")", "<", "==", "and",
                                 "not", "if", "then", "else", "True", "abs", "min", ",", "max"]), max_size=25))
def test_fuzzed_rules_are_a_table_or_one_line(tokens):
    fn = {"name": "g", "params": ["x", "y"], "rule": " ".join(tokens)}
    try:
        task = task_from_dict(_with([fn], 7))
    except RlmlabError as e:
        assert "\n" not in str(e)
        return
    for x in range(7):
        for y in range(7):
            v = task.library["g"].impl(x, y)
            assert isinstance(v, bool) or 0 <= v < 7


# --- checkpoints and folders of two tasks ------------------------------------------------------

def test_a_checkpoint_whose_vocabulary_is_not_the_tasks_is_refused(tmp_path, capsys):
    run = tmp_path / "rm"
    shutil.copytree(RELEASED / "rm", run)
    assert load_run(run).task == paper_task()
    assert load_run(run, task=str(PAPER_FILE)).vocab == paper_task().vocab
    with pytest.raises(TaskError, match="belongs to task 'paper'"):
        load_run(run, task="mod7")
    meta_path = run / "best" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    v = meta["vocab"]
    i, j = v.index("3"), v.index("4")
    v[i], v[j] = v[j], v[i]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="digest does not match"):  # an edit is caught first
        load_run(run)
    meta["digest"] = meta_digest(meta)  # re-sealed: only the task's vocabulary can refuse it
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="vocabulary differs"):
        load_run(run)
    data = tmp_path / "e.txt"
    data.write_text("add(1,2)\n")
    assert main(["eval", str(run), "--data", str(data), "--quiet"]) == 2
    assert "vocabulary differs" in capsys.readouterr().err


def test_smoke_experiment_on_the_second_task_and_no_mixing(tmp_path, capsys):
    out = tmp_path / "exp"
    assert main(["run", "length", "--preset", "smoke", "--task", "mod7", "--out", str(out), "--quiet"]) == 0
    meta = json.loads((out / "experiment.json").read_text())
    assert meta["task"] == load_task("mod7").identity
    ckpt = json.loads((out / "length-96" / "rm" / "best" / "checkpoint.json").read_text())
    assert ckpt["task"]["digest"] == load_task("mod7").digest and ckpt["config"]["data"]["task"] == "mod7"
    assert main(["run", "length", "--preset", "smoke", "--task", "mod7", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", "length", "--preset", "smoke", "--out", str(out), "--quiet"]) == 2
    assert "another task" in capsys.readouterr().err
    assert main(["report", str(out)]) == 0
    res = read_results(out / "length-96" / "rm" / "eval")
    assert res and all(parse(r["expr"], load_task("mod7").library) for r in res)


@pytest.mark.parametrize("name", TASKS)
def test_the_task_command_describes_and_prints_a_task_that_reads_back_the_same(name, capsys, tmp_path):
    assert main(["task", name]) == 0
    out = capsys.readouterr().out
    assert load_task(name).digest in out and f"vocabulary  {len(load_task(name).vocab)} tokens" in out
    assert main(["task", name, "--toml"]) == 0
    path = tmp_path / "t.toml"
    path.write_text(capsys.readouterr().out)
    assert load_task(str(path)).digest == load_task(name).digest


def test_train_and_eval_on_a_task_file(tmp_path, capsys, one_torch_thread):
    task_file = tmp_path / "mine.toml"
    task_file.write_text((TASKS_DIR / "mod7.toml").read_text().replace('name = "mod7"', 'name = "mine"'))
    pool, paper_pool = tmp_path / "pool.parquet", tmp_path / "paper.parquet"
    assert main(["data", "pool", "--task", str(task_file), "--n", "300", "--seed", "1", "--out", str(pool),
                 "--quiet", "--workers", "1"]) == 0
    write_pool(build_pool(300, 1, workers=1, task=PAPER), paper_pool)
    run = tmp_path / "run"
    common = ["train", "--learner", "rm", "--preset", "tiny", "--out", str(run), "--max-steps", "2", "--quiet",
              "--data.val_size=50", "--train.answer_eval=0", "--data.cache_dir="]
    assert main([*common, "--data", str(paper_pool), "--task", str(task_file)]) == 2  # a pool of another task
    assert "belongs to task 'paper'" in capsys.readouterr().err and not run.exists()
    assert main([*common, "--data", str(pool), "--task", str(task_file)]) == 0
    saved = json.loads((run / "best" / "checkpoint.json").read_text())
    assert saved["task"]["digest"] == load_task("mod7").digest  # the name is not part of the identity
    assert saved["config"]["data"]["task"] == str(task_file.resolve())
    capsys.readouterr()
    assert main(["eval", str(run), "--data", str(pool), "--limit", "5", "--quiet", "--max-new-tokens", "20"]) == 0
    summary = json.loads((run / "eval" / "pool" / "summary.json").read_text())
    assert summary["task"]["digest"] == load_task("mod7").digest
    assert main(["eval", str(run), "--data", str(paper_pool), "--limit", "5", "--quiet"]) == 2
    assert main(["eval", str(run), "--task", "paper", "--data", str(pool), "--quiet"]) == 2
    assert "belongs to task 'mine'" in capsys.readouterr().err

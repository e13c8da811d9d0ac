"""The training loop: learning, exact resume, stopping rules, checkpoint selection, and the CLI."""

import itertools
import json
import random
import time

import pytest
import torch

from rlmlab.cli import main
from rlmlab.errors import ConfigError
from rlmlab.learning.checkpoint import load_run
from rlmlab.learning.config import DataSettings, ModelSettings, RunConfig, TrainConfig
from rlmlab.learning.examples import build_examples
from rlmlab.learning.optim import describe_schedule, lr_at
from rlmlab.learning.train import train
from rlmlab.runlog import convert_metrics, read_metrics
from rlmlab.task.expr import to_text
from rlmlab.task.pool import build_pool, write_pool
from rlmlab.task.sampler import ExpressionSampler
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


@pytest.fixture(scope="module")
def data():
    """Short expressions (trace <= 150 tokens), both learners, 30 held out."""
    sampler, rng = ExpressionSampler(library=PAPER.library), random.Random(11)
    exprs = [to_text(e) for e in (sampler.sample(rng) for _ in range(600)) if PAPER.trace_stats(e).trace_len <= 150]
    train_exprs, val_exprs = exprs[:-30], exprs[-30:]
    vocab = PAPER.vocab
    return {v: (build_examples(train_exprs, v, vocab, task=PAPER), build_examples(val_exprs, v, vocab, task=PAPER)) for v in ("rm", "cot")}


def config(learner="rm", dropout=None, **train) -> RunConfig:
    t = dict(max_steps=16, warmup_steps=4, eval_every=8, log_every=1, batch_size=16, seed=7)
    return RunConfig(ModelSettings(preset="tiny", dropout=dropout), DataSettings(learner=learner, row_len=128, cache_dir=""),
                     TrainConfig(**{**t, **train}))


def records(run, kind):
    return [r for r in read_metrics(run) if r["kind"] == kind]


def test_lr_schedule():
    t = TrainConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, t, 110) == pytest.approx(0.1) and lr_at(9, t, 110) == pytest.approx(1.0)
    assert lr_at(60, t, 110) == pytest.approx(0.55) and lr_at(110, t, 110) == pytest.approx(0.1)
    assert lr_at(500, t, 110) == pytest.approx(0.1) and lr_at(500, t, None) == 1.0


def test_the_schedule_line_says_what_lr_at_does():
    t = TrainConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1, max_steps=110)
    assert describe_schedule(t, 110) == "10 warm-up steps to lr 1, then cosine to 0.1 at step 110; stops at step 110"
    # A run shorter than its warm-up (a short check of the paper preset) never leaves it.
    short = TrainConfig(lr=1.0, warmup_steps=10, max_steps=4)
    assert describe_schedule(short, 4).startswith("10 warm-up steps to lr 1, cut short: the run stops in warm-up, "
                                                  "at lr 0.4;")
    assert lr_at(3, short, 4) == pytest.approx(0.4)
    within = TrainConfig(lr=1.0, warmup_steps=10, decay_steps=5, max_steps=50)
    assert "then constant (the decay horizon, step 5, is within warm-up)" in describe_schedule(within, 5)
    assert lr_at(30, within, 5) == 1.0
    assert "then constant (no step horizon" in describe_schedule(TrainConfig(lr=1.0, warmup_steps=10), None)


def test_a_wall_clock_limit_stops_the_run_and_never_changes_its_schedule(data, tmp_path, monkeypatch):
    # A clock that advances 20 ms per reading: the limit falls mid-run whatever the machine's load.
    tr, va = data["rm"]
    quiet = dict(progress=False, echo=lambda s: None)
    full = train(config(dropout=0.1), tr, va, tmp_path / "a", **quiet, task=PAPER)
    ticks = itertools.count()
    with monkeypatch.context() as m:
        m.setattr(time, "perf_counter", lambda: 0.02 * next(ticks))
        stopped = train(config(dropout=0.1, max_minutes=0.005), tr, va, tmp_path / "b", **quiet, task=PAPER)
    assert stopped.stop_reason == "time_limit" and 0 < stopped.step < 16
    a, b = records(tmp_path / "a", "train"), records(tmp_path / "b", "train")
    assert [(r["step"], r["lr"]) for r in b] == [(r["step"], r["lr"]) for r in a[:stopped.step]]
    assert all(r["step"] % 8 == 0 for r in records(tmp_path / "b", "val"))  # no validation off the grid
    assert json.loads((tmp_path / "b" / "last" / "checkpoint.json").read_text())["step"] == stopped.step
    # Lifting the limit continues the very same run.
    resumed = train(config(dropout=0.1), tr, va, tmp_path / "b", resume=True, **quiet, task=PAPER)
    assert (resumed.step, resumed.stop_reason, resumed.best_step) == (16, "max_steps", full.best_step)
    b = records(tmp_path / "b", "train")
    assert [(r["loss"], r["lr"]) for r in a] == [(r["loss"], r["lr"]) for r in b]
    wa, wb = load_run(tmp_path / "a", "last").model, load_run(tmp_path / "b", "last").model
    assert all(torch.equal(x, y) for x, y in zip(wa.state_dict().values(), wb.state_dict().values()))
    # Without a step budget, the time limit is the run's end and the rate stays at its peak.
    with monkeypatch.context() as m:
        m.setattr(time, "perf_counter", lambda: 0.02 * next(ticks))
        timed = train(config(max_steps=None, max_minutes=0.01, warmup_steps=2), tr, va, tmp_path / "t", **quiet, task=PAPER)
    assert timed.stop_reason == "max_minutes"
    assert {r["lr"] for r in records(tmp_path / "t", "train") if r["step"] > 2} == {TrainConfig.lr}


def test_a_larger_step_budget_keeps_the_schedule_fixed_at_the_start(data, tmp_path):
    tr, va = data["rm"]
    quiet = dict(progress=False, echo=lambda s: None)
    train(config(max_steps=8), tr, va, tmp_path / "a", **quiet, task=PAPER)
    train(config(max_steps=12), tr, va, tmp_path / "a", resume=True, **quiet, task=PAPER)
    lrs = {r["step"]: r["lr"] for r in records(tmp_path / "a", "train")}
    floor = TrainConfig.lr * TrainConfig.min_lr_ratio
    # (a record's rate is that of the step it ends: step 9 runs at the floor the cosine reached)
    assert lrs[8] > floor and all(lrs[s] == pytest.approx(floor) for s in range(9, 13))
    meta = json.loads((tmp_path / "a" / "last" / "checkpoint.json").read_text())
    assert meta["trainer"]["schedule_steps"] == 8


def test_another_thread_count_trains_the_same_steps_at_the_same_rates(data, tmp_path):
    tr, va = data["rm"]
    quiet = dict(progress=False, echo=lambda s: None)
    for threads in (1, 2):
        train(config(max_steps=10, threads=threads), tr, va, tmp_path / str(threads), **quiet, task=PAPER)
    one, two = records(tmp_path / "1", "train"), records(tmp_path / "2", "train")
    assert [(r["step"], r["lr"], r["tokens"]) for r in one] == [(r["step"], r["lr"], r["tokens"]) for r in two]
    assert [r["step"] for r in one] == list(range(1, 11))


def test_two_runs_of_one_config_give_identical_weights(data, tmp_path):
    tr, va = data["cot"]
    quiet = dict(progress=False, echo=lambda s: None)
    for name in ("a", "b"):
        train(config("cot", dropout=0.1, max_steps=6, eval_every=3), tr, va, tmp_path / name, **quiet, task=PAPER)
    for which in ("last", "best"):
        wa, wb = load_run(tmp_path / "a", which).model, load_run(tmp_path / "b", which).model
        assert all(torch.equal(x, y) for x, y in zip(wa.state_dict().values(), wb.state_dict().values()))


def test_a_tiny_model_learns(data, tmp_path):
    tr, va = data["rm"]
    result = train(config(max_steps=40, lr=1e-2, warmup_steps=5, eval_every=20, batch_size=64), tr, va,
                   tmp_path, progress=False, echo=lambda s: None, task=PAPER)
    losses = [r["loss"] for r in records(tmp_path, "train")]
    assert len(losses) == 40 and result.stop_reason == "max_steps"
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:3]) / 3, losses
    val = records(tmp_path, "val")
    assert val[-1]["loss"] < val[0]["loss"] and val[-1]["token_acc"] > 0.5


def test_resume_equals_uninterrupted(data, tmp_path):
    tr, va = data["rm"]
    quiet = dict(progress=False, echo=lambda s: None)
    train(config(dropout=0.1, max_steps=16, decay_steps=16), tr, va, tmp_path / "a", **quiet, task=PAPER)
    train(config(dropout=0.1, max_steps=8, decay_steps=16), tr, va, tmp_path / "b", **quiet, task=PAPER)
    with pytest.raises(ConfigError, match="--resume cannot change train.lr"):
        train(config(dropout=0.1, max_steps=16, decay_steps=16, lr=5e-4), tr, va, tmp_path / "b", resume=True, **quiet, task=PAPER)
    result = train(config(dropout=0.1, max_steps=16, decay_steps=16), tr, va, tmp_path / "b", resume=True, **quiet, task=PAPER)
    assert result.step == 16
    a, b = records(tmp_path / "a", "train"), records(tmp_path / "b", "train")
    assert [r["step"] for r in b] == list(range(1, 17))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # exactly, not approximately
    # Logged every 3 steps, a record after the resume at step 8 still averages steps 7-9.
    train(config(max_steps=16, decay_steps=16, log_every=3), tr, va, tmp_path / "c", **quiet, task=PAPER)
    train(config(max_steps=8, decay_steps=16, log_every=3), tr, va, tmp_path / "d", **quiet, task=PAPER)
    train(config(max_steps=16, decay_steps=16, log_every=3), tr, va, tmp_path / "d", resume=True, **quiet, task=PAPER)
    c, d = records(tmp_path / "c", "train"), records(tmp_path / "d", "train")
    assert [r["step"] for r in d] == [3, 6, 9, 12, 15]
    assert [r["loss"] for r in c] == [r["loss"] for r in d]
    # Both clocks run on across the resume: the second session starts where the first saved.
    for clock in ("elapsed_s", "cpu_s"):
        times = [r[clock] for r in b]
        assert times == sorted(times) and times[0] > 0
    # The log says the run was resumed, where, and its report lists it.
    assert [(r["step"], r["elapsed_s"] > 0) for r in records(tmp_path / "b", "resume")] == [(8, True)]
    assert records(tmp_path / "a", "resume") == []
    from rlmlab.experiments.training_log import training_summary, training_table

    summary = {**training_summary(tmp_path / "b"), "job": "toy", "learner": "rm"}
    assert summary["resumed_at"] == [8] and "- toy RM: at step 8 (budget extended)\n" in training_table([summary])
    assert "Resumed" not in training_table([{**training_summary(tmp_path / "a"), "job": "toy", "learner": "rm"}])
    wa, wb = load_run(tmp_path / "a", "last").model, load_run(tmp_path / "b", "last").model
    assert all(torch.equal(x, y) for x, y in zip(wa.state_dict().values(), wb.state_dict().values()))
    with pytest.raises(ConfigError, match="already holds a run"):
        train(config(), tr, va, tmp_path / "a", **quiet, task=PAPER)


def test_a_run_saved_by_an_earlier_commit_resumes_as_if_it_had_never_stopped(tmp_path):
    """Long trainings outlive the code that started them: a run that commit 8cb4743 stopped at
    step 8 (tests/fixtures/resume-8cb4743, made by its make.py) resumed with today's code logs
    the losses of that commit's uninterrupted run and ends with its weights, bit for bit on
    the processor and torch it was made with, within float noise elsewhere."""
    import dataclasses
    import hashlib
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file

    from rlmlab.machine import SAME_BITS, machine_facts

    fixture = Path(__file__).parent / "fixtures" / "resume-8cb4743"
    expected = json.loads((fixture / "expected.json").read_text())
    exprs = json.loads((fixture / "exprs.json").read_text())
    tr, va = (build_examples(exprs[k], "rm", PAPER.vocab, workers=1, task=PAPER) for k in ("train", "val"))
    run = tmp_path / "run"
    shutil.copytree(fixture / "run", run)
    saved = RunConfig.from_dict(json.loads((run / "config.json").read_text()))
    cfg = dataclasses.replace(saved, train=dataclasses.replace(saved.train, max_steps=expected["end"]))
    result = train(cfg, tr, va, run, resume=True, progress=False, echo=lambda s: None, task=PAPER)
    assert (result.step, result.best_step) == (expected["end"], expected["best_step"])
    losses = {kind: {str(r["step"]): r["loss"] for r in records(run, kind) if r["step"] > expected["stop"]}
              for kind in ("train", "val")}
    weights = load_file(run / "last" / "model.safetensors")
    here, there = machine_facts(), expected["machine"]
    if any(here.get(k) != there.get(k) for k in SAME_BITS):
        assert losses["train"] == pytest.approx(expected["train_loss"], rel=1e-4)
        assert losses["val"] == pytest.approx(expected["val_loss"], rel=1e-4)
        reference = load_file(fixture / "expected-last.safetensors")
        assert weights.keys() == reference.keys()
        for k, t in reference.items():
            torch.testing.assert_close(weights[k], t, atol=1e-5, rtol=1e-4)
        return
    assert (losses["train"], losses["val"]) == (expected["train_loss"], expected["val_loss"])
    assert {k: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()
            for k, t in sorted(weights.items())} == expected["last_sha256"]


def test_a_run_resumes_only_on_the_training_examples_it_started_on(data, tmp_path):
    import dataclasses

    import numpy as np

    from rlmlab.errors import DataError

    tr, va = data["rm"]
    quiet = dict(progress=False, echo=lambda s: None)
    train(config(max_steps=4, decay_steps=8), tr, va, tmp_path / "a", **quiet, task=PAPER)
    saved = json.loads((tmp_path / "a" / "last" / "checkpoint.json").read_text())["trainer"]
    assert saved["data_sha256"] == {"train": tr.digest(), "val": va.digest()}
    keep = np.ones(len(tr), dtype=bool)
    keep[-1] = False  # one example fewer: the same rows would be cut at other places
    with pytest.raises(DataError, match="other train examples"):
        train(config(max_steps=8, decay_steps=8), tr.select(keep), va, tmp_path / "a", resume=True, **quiet, task=PAPER)
    with pytest.raises(DataError, match="other val examples"):
        train(config(max_steps=8, decay_steps=8), tr, va.select(np.arange(len(va)) > 0), tmp_path / "a", resume=True, **quiet, task=PAPER)
    # The data's files may move (another machine, another --out): their contents are what counts.
    cfg = config(max_steps=8, decay_steps=8)
    moved = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train="elsewhere/train.parquet",
                                                              val="elsewhere/val.parquet"))
    assert train(moved, tr, va, tmp_path / "a", resume=True, **quiet, task=PAPER).step == 8
    # Each session names the machine it ran on.
    sessions = records(tmp_path / "a", "start") + records(tmp_path / "a", "resume")
    assert [r["step"] for r in sessions] == [0, 4]
    assert all(r["machine"]["torch"] == torch.__version__ and r["machine"]["cpu"] for r in sessions)
    assert all(r["machine"]["isa"] == torch.backends.cpu.get_cpu_capability() for r in sessions)


def test_a_run_saved_without_data_digests_resumes_on_its_own_files_and_records_them(data, tmp_path):
    import dataclasses

    from rlmlab.learning import checkpoint as ck

    tr, va = data["rm"]
    quiet = dict(progress=False, echo=lambda s: None)
    train(config(max_steps=4, decay_steps=8), tr, va, tmp_path / "a", **quiet, task=PAPER)
    path = tmp_path / "a" / "last" / "checkpoint.json"
    meta = json.loads(path.read_text())
    del meta["trainer"]["data_sha256"]  # as a checkpoint saved before they were recorded
    meta["digest"] = ck.meta_digest(meta)
    path.write_text(json.dumps(meta, indent=1))
    cfg = config(max_steps=8, decay_steps=8)
    moved = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train="elsewhere/train.parquet"))
    with pytest.raises(ConfigError, match="--resume cannot change data.train"):
        train(moved, tr, va, tmp_path / "a", resume=True, **quiet, task=PAPER)
    assert train(cfg, tr, va, tmp_path / "a", resume=True, **quiet, task=PAPER).step == 8
    assert json.loads(path.read_text())["trainer"]["data_sha256"] == {"train": tr.digest(), "val": va.digest()}


def test_sigterm_saves_and_the_resumed_run_equals_an_uninterrupted_one(data, tmp_path, monkeypatch):
    import os
    import signal

    import rlmlab.learning.train as training

    tr, va = data["rm"]
    quiet = dict(progress=False, echo=lambda s: None)
    cfg = config(dropout=0.1, max_steps=16, decay_steps=16, eval_every=4)
    uninterrupted = train(cfg, tr, va, tmp_path / "a", **quiet, task=PAPER)
    step = training.train_step
    calls = itertools.count(1)

    def terminated_during_step_6(*args, **kwargs):
        if next(calls) == 6:
            os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler preempting the job would
        return step(*args, **kwargs)

    before = signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as m:
        m.setattr(training, "train_step", terminated_during_step_6)
        stopped = train(cfg, tr, va, tmp_path / "b", **quiet, task=PAPER)
    assert signal.getsignal(signal.SIGTERM) == before  # restored after the run
    assert (stopped.step, stopped.stop_reason) == (6, "interrupted")
    assert json.loads((tmp_path / "b" / "last" / "checkpoint.json").read_text())["step"] == 6
    assert [r["step"] for r in records(tmp_path / "b", "val")] == [4]  # no validation off the grid
    resumed = train(cfg, tr, va, tmp_path / "b", resume=True, **quiet, task=PAPER)
    a, b = records(tmp_path / "a", "val"), records(tmp_path / "b", "val")
    assert [r["step"] for r in b] == [4, 8, 12, 16]
    assert [(r["loss"], r["best"]) for r in a] == [(r["loss"], r["best"]) for r in b]
    assert (resumed.best_step, resumed.best_score) == (uninterrupted.best_step, uninterrupted.best_score)
    assert load_run(tmp_path / "b", "best").step == uninterrupted.best_step


def test_validate_fn_selects_the_best_checkpoint_without_touching_training(data, tmp_path):
    tr, va = data["cot"]
    scores = iter([0.2, 0.6, 0.4])
    seen = []

    def validate(model, vocab, learner):
        seen.append((learner, model.training, len(vocab)))
        torch.rand(1000)  # a hook that draws random numbers must not change the training stream
        return {"answer_acc": next(scores)}

    quiet = dict(progress=False, echo=lambda s: None)
    small = dict(dropout=0.1, max_steps=6, eval_every=2, batch_size=8)
    result = train(config("cot", **small), tr, va, tmp_path / "h", validate_fn=validate, **quiet, task=PAPER)
    train(config("cot", **small), tr, va, tmp_path / "n", **quiet, task=PAPER)
    assert seen == [("cot", False, len(PAPER.vocab))] * 3
    assert (result.select_metric, result.best_score, result.best_step) == ("answer_acc", 0.6, 4)
    best = load_run(tmp_path / "h")
    assert best.step == 4 and best.metrics["val/answer_acc"] == 0.6 and best.learner == "cot"
    losses = {run: [r["loss"] for r in records(tmp_path / run, "train")] for run in ("h", "n")}
    assert losses["h"] == losses["n"]


def test_tokens_per_second_leave_out_the_time_spent_validating(data, tmp_path):
    tr, va = data["rm"]

    def slow_validate(model, vocab, learner):
        time.sleep(1.0)
        return {"answer_acc": 0.5}

    train(config(max_steps=6, eval_every=2, log_every=2), tr, va, tmp_path / "v", validate_fn=slow_validate,
          progress=False, echo=lambda s: None, task=PAPER)
    logged = records(tmp_path / "v", "train")
    assert [r["step"] for r in logged] == [2, 4, 6]
    for before, after in itertools.pairwise(logged):
        wall_s = after["elapsed_s"] - before["elapsed_s"]  # holds one validation, so over a second
        step_s = (after["tokens"] - before["tokens"]) / after["tok_s"]
        assert wall_s > 1.0 and 0 < step_s < wall_s - 0.9


def test_stopping_rules(data, tmp_path):
    tr, va = data["rm"]
    quiet = dict(progress=False, echo=lambda s: None)
    r = train(config(max_steps=None, patience=2, min_delta=10.0, eval_every=2), tr, va, tmp_path / "p", **quiet, task=PAPER)
    assert (r.stop_reason, r.step) == ("plateau", 6)  # best still follows any improvement
    r = train(config(max_steps=None, max_minutes=1e-6), tr, va, tmp_path / "m", **quiet, task=PAPER)
    assert r.stop_reason == "max_minutes" and r.step <= 1
    assert load_run(tmp_path / "m", "last").step == r.step
    with pytest.raises(ConfigError, match="no stopping rule"):
        train(config(max_steps=None), tr, va, tmp_path / "x", **quiet, task=PAPER)
    with pytest.raises(ConfigError, match="select_metric='bleu'"):
        train(config(max_steps=2, select_metric="bleu"), tr, va, tmp_path / "s", **quiet, task=PAPER)


def test_cli_train_smoke(tmp_path, capsys, monkeypatch):
    import rlmlab.measuring.score

    asked = []

    def fake_answer_accuracy_fn(exprs, **kwargs):  # greedy decoding of an untrained model is slow; the plumbing is tested
        asked.append(list(exprs))
        return lambda model, vocab, learner: {"answer_acc": 0.25, "answer_valid": 0.5}

    monkeypatch.setattr(rlmlab.measuring.score, "answer_accuracy_fn", fake_answer_accuracy_fn)
    pool = tmp_path / "pool.parquet"
    write_pool(build_pool(150, 5, workers=1, task=PAPER), pool)
    out = tmp_path / "run"
    args = ["train", "--learner", "cot", "--model", "tiny", "--data", str(pool), "--out", str(out), "--max-steps", "4",
            "--data.val_size=20", "--data.cache_dir=", "--data.row_len=256", "--train.eval_every=2",
            "--train.warmup_steps=2", "--train.batch_size=8", "--train.log_every=1", "--train.answer_eval=4", "--quiet"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "parameters (paper-style" in text and "stopped at step 4 (max_steps)" in text
    run = load_run(out)
    assert run.learner == "cot" and run.config["model"]["preset"] == "tiny" and run.step in (2, 4)
    assert run.metrics["val/answer_acc"] == 0.25 and len(asked[0]) == 4
    assert records(out, "end")[-1]["select_metric"] == "answer_acc"
    assert sorted(p.name for p in out.iterdir()) == ["best", "config.json", "last", "metrics.jsonl"]
    assert main(args) == 2  # the folder holds a run and --resume was not given
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--resume", "--max-steps", "6", "--quiet"]) == 0
    assert load_run(out, "last").step == 6
    n_records = len(read_metrics(out))
    assert main(["train", "--out", str(out), "--resume", "--quiet"]) == 0  # nothing left to do
    assert load_run(out, "last").step == 6 and len(records(out, "train")) == 6
    added = [r["kind"] for r in read_metrics(out)[n_records:]]
    assert added == ["resume", "end"]  # no step: it says it was resumed, and ends
    # Converted to Parquet (as `rlmlab export` leaves a run) and trained on: the log goes on as lines.
    before = read_metrics(out)
    assert convert_metrics(out) and not (out / "metrics.jsonl").exists() and read_metrics(out) == before
    assert main(["train", "--out", str(out), "--resume", "--max-steps", "8", "--quiet"]) == 0
    assert (out / "metrics.jsonl").exists() and not (out / "metrics.parquet").exists()
    kept = [r for r in before if isinstance(r.get("step"), int) and r["step"] <= 6]
    assert read_metrics(out)[:len(kept)] == kept and len(records(out, "train")) == 8
    assert main(args[:-1] + ["--train.lr=fast"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "rlmlab train: error: train.lr: expected float, got 'fast'"


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(data, tmp_path, monkeypatch):
    import rlmlab.learning.step as step_mod
    from rlmlab.errors import TrainingDiverged

    tr, va = data["rm"]
    real, calls = step_mod.batch_loss, {"n": 0}

    def poisoned(fwd, batch, device):
        loss, n = real(fwd, batch, device)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] > 10 else loss), n  # from the 11th step on

    monkeypatch.setattr(step_mod, "batch_loss", poisoned)
    with pytest.raises(TrainingDiverged, match="non-finite training loss"):
        train(config(max_steps=16, eval_every=4), tr, va, tmp_path, progress=False, echo=lambda s: None, task=PAPER)
    # (validations call batch_loss too, so the poisoned step is the 9th here)
    diverged = records(tmp_path, "diverged")[0]["step"]
    last = load_run(tmp_path, "last")
    assert diverged == 8 and not records(tmp_path, "end")
    assert last.step == 8 and all(torch.isfinite(p).all() for p in last.model.parameters())


def test_start_offsets_train_table_rows_beyond_the_examples_and_resume_exactly(data, tmp_path):
    tr, va = data["cot"]
    quiet = dict(progress=False, echo=lambda s: None)
    longest = int(tr.lengths.max())
    with pytest.raises(ConfigError, match="train.start_offset"):
        TrainConfig(start_offset=-1)
    cfg = config("cot", max_steps=8, decay_steps=8, start_offset=2048)
    train(cfg, tr, va, tmp_path / "a", **quiet, task=PAPER)
    train(config("cot", max_steps=4, decay_steps=8, start_offset=2048), tr, va, tmp_path / "b", **quiet, task=PAPER)
    with pytest.raises(ConfigError, match="--resume cannot change train.start_offset"):
        train(config("cot", max_steps=8, decay_steps=8), tr, va, tmp_path / "b", resume=True, **quiet, task=PAPER)
    train(cfg, tr, va, tmp_path / "b", resume=True, **quiet, task=PAPER)
    assert [r["loss"] for r in records(tmp_path / "a", "train")] == [r["loss"] for r in records(tmp_path / "b", "train")]
    train(config("cot", max_steps=8, decay_steps=8), tr, va, tmp_path / "c", **quiet, task=PAPER)
    # The tiny CoT's table has 2,048 rows. Without offsets, rows past the longest example get no
    # gradient: AdamW's decay only shrinks them towards 0. With offsets they are trained.
    from rlmlab.learning.model import Transformer

    far = slice(longest + 1, None)
    cfg_c = load_run(tmp_path / "c", "last").model.cfg
    torch.manual_seed(7)  # the runs' seed: their initial weights
    init = Transformer(cfg_c).wpe.weight.detach()[far]
    for run, only_decayed in (("c", True), ("a", False)):
        moved = load_run(tmp_path / run, "last").model.wpe.weight.detach()[far] - init
        cos = torch.nn.functional.cosine_similarity(moved.flatten(), -init.flatten(), dim=0)
        assert moved.abs().max() > 0 and (cos > 0.9999) == only_decayed, (run, float(cos))

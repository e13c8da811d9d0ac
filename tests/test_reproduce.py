"""`rlmlab reproduce`: a committed results folder against a fresh run of its stored commands,
or against its released checkpoints re-evaluated. The fixture tests/fixtures/smoke-length is
`rlmlab run length --preset smoke --out runs/smoke-length --threads 1` exported with `rlmlab
export runs/smoke-length tests/fixtures/smoke-length`."""

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from rlmlab.cli import main
from rlmlab.experiments.convert import convert_folder
from rlmlab.experiments.reproduce import compare, compare_training_logs, rerun_command, stored_commands
from rlmlab.measuring.result_files import find_eval_dir, read_results
from rlmlab.runlog import convert_metrics, read_metrics

FIXTURE = Path(__file__).parent / "fixtures" / "smoke-length"
RUNS = ("length-96/rm", "length-96/cot")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """The fixture's stored commands re-run from scratch."""
    out = tmp_path_factory.mktemp("reproduce") / "fresh"
    assert main(["reproduce", str(FIXTURE), "--out", str(out), "--strict"]) == 0
    return out


def decoded(folder: Path, run: str) -> list[tuple]:
    return [(r["expr"], r["prediction"], r["diverge_at"], r["generated"], r["correct"])
            for r in read_results(find_eval_dir(folder / run, "eval"))]  # the fixture's folders are the old layout


def test_a_rerun_of_the_stored_commands_decodes_every_expression_as_committed(fresh):
    # A step-budgeted run from scratch trains the same weights: the untrained smoke model's
    # (arbitrary) traces come out token for token the same.
    for run in RUNS:
        assert decoded(fresh, run) == decoded(FIXTURE, run) and len(decoded(fresh, run)) == 40
    checked = json.loads((fresh / "reproduce.json").read_text())
    assert len(checked["cells"]) == 40 and all(c["inside"] for c in checked["cells"]) and not checked["missing"]
    argv = json.loads((fresh / "commands.jsonl").read_text().splitlines()[0])["argv"]
    assert argv[argv.index("--out") + 1] == str(fresh) and "--threads=1" in argv


def test_the_training_logs_of_a_rerun_are_compared_step_by_step(fresh, tmp_path):
    # On one processor a re-run logs bit for bit what the first run logged. The committed
    # fixture is not the reference here: it was trained on another processor, whose kernels may
    # round the last digits of a loss differently (its decoded traces still agree, above).
    again = tmp_path / "again"
    assert main(["reproduce", str(fresh), "--out", str(again), "--strict"]) == 0
    verdicts = compare_training_logs(fresh, again)
    assert sorted(verdicts) == sorted(RUNS)
    assert all(v == "training log identical on all 2 records both hold" for v in verdicts.values()), verdicts
    assert json.loads((again / "reproduce.json").read_text())["training_logs"] == verdicts
    # A log converted to Parquet is the same log.
    converted = tmp_path / "converted"
    shutil.copytree(fresh, converted)
    assert convert_folder(converted)["metrics"] == len(RUNS)
    assert compare_training_logs(converted, fresh) == compare_training_logs(fresh, converted) == verdicts
    # One loss changed in its last digits, in a live log (JSON lines) or a converted one (Parquet).
    changed = tmp_path / "changed"
    shutil.copytree(fresh, changed)
    run = changed / "length-96" / "rm"
    lines = read_metrics(run)
    last = [r for r in lines if r.get("kind") == "val"][-1]
    last["loss"] += 1e-9  # the smoke run logs its validations only
    (run / "metrics.parquet").unlink(missing_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert compare_training_logs(changed, fresh)["length-96/rm"] == f"training log differs from step {last['step']} (val)"
    assert convert_metrics(run) and not (run / "metrics.jsonl").exists()
    assert compare_training_logs(changed, fresh)["length-96/rm"] == f"training log differs from step {last['step']} (val)"


def test_cells_whose_intervals_disagree_are_flagged(fresh, tmp_path, capsys):
    tampered = tmp_path / "tampered"
    shutil.copytree(FIXTURE, tampered)
    path = tampered / "report" / "report.json"
    report = json.loads(path.read_text())
    report["rows"][1]["cot"].update(accuracy=0.75, ci95=[0.3, 0.95])  # as if 3 of 4 had been right
    path.write_text(json.dumps(report))
    checks, missing = compare(tampered, fresh)
    assert [c.cell for c in checks if not c.inside] == ["rows[bin=0.25-0.5].cot"] and not missing
    # --strict turns a flagged cell into exit status 1, after the table
    assert main(["reproduce", str(tampered), "--out", str(tmp_path / "again"), "--checkpoints",
                 str(fresh / "length-96"), "--strict"]) == 1
    assert "DISAGREE" in capsys.readouterr().out
    # A committed value inside the fresh cell's (wider) interval agrees, as a sample's does.
    report["rows"][1]["cot"].update(accuracy=0.25, ci95=[0.2, 0.3])
    path.write_text(json.dumps(report))
    assert all(c.inside for c in compare(tampered, fresh)[0])


def test_released_checkpoints_reevaluated_on_a_sample_give_the_committed_predictions(fresh, tmp_path, capsys):
    out = tmp_path / "reeval"
    assert main(["reproduce", str(FIXTURE), "--checkpoints", str(fresh / "length-96"), "--out", str(out),
                 "--sample", "2", "--strict"]) == 0
    printed = capsys.readouterr().out
    assert "length-96/rm/eval: 20 of 20 expressions with the committed prediction" in printed
    assert "length-96/cot/eval: 20 of 20 expressions" in printed
    for run in RUNS:  # the first two expressions of each bin
        committed = decoded(FIXTURE, run)
        assert decoded(out, run) == [committed[i] for i in range(40) if i % 4 < 2]


def test_checkpoints_reevaluated_on_a_folder_of_the_current_layout(fresh, tmp_path, capsys):
    # `fresh` is this version's run: its set "eval" lies in <run>/eval/, the fixture's in eval/eval/.
    assert not (fresh / "length-96" / "rm" / "eval" / "eval").exists()
    out = tmp_path / "reeval"
    assert main(["reproduce", str(fresh), "--checkpoints", str(fresh / "length-96"), "--out", str(out),
                 "--sample", "1", "--strict"]) == 0
    assert "length-96/rm/eval: 10 of 10 expressions with the committed prediction" in capsys.readouterr().out
    for run in RUNS:
        full = decoded(fresh, run)
        assert decoded(out, run) == [full[i] for i in range(40) if i % 4 == 0]


def test_flat_checkpoints_are_seed_0_of_a_folder_with_several_seeds(fresh, tmp_path, capsys):
    # `rlmlab/released/<name>/<learner>/best` against a results folder that also holds seeds 1, 2.
    seeded = tmp_path / "seeded"
    shutil.copytree(fresh, seeded)
    shutil.copytree(seeded / "length-96", seeded / "length-96-s1")
    out = tmp_path / "reeval"
    assert main(["reproduce", str(seeded), "--checkpoints", str(fresh / "length-96"), "--out", str(out),
                 "--sample", "1"]) == 0
    printed = capsys.readouterr().out
    assert "length-96/rm/eval: 10 of 10 expressions with the committed prediction" in printed
    assert "length-96/cot/eval: 10 of 10" in printed and "length-96-s1/rm/eval:" not in printed
    assert not (out / "length-96-s1").exists()


def test_a_rerun_command_keeps_the_stored_settings_and_replaces_what_is_asked():
    argv = ["rlmlab", "run", "length", "--preset", "paper-cpu", "--out", "runs/length-595", "--views=rm,cot",
            "--threads=1", "--learner-setting=per_view.cot.train.max_steps=24000"]
    new = rerun_command(argv, Path("runs/check"), learners=["cot"], sample=20)
    assert new == ["rlmlab", "run", "length", "--preset", "paper-cpu", "--threads=1",
                   "--learner-setting=per_view.cot.train.max_steps=24000", "--out=runs/check", "--learners=cot",
                   "--preset.eval_sample=20", "--quiet"]
    assert rerun_command(argv, Path("x"), learners=["rm-frames"]) is None
    # A command stored with today's spelling, `--learners`.
    argv = ["rlmlab", "run", "length", "--preset", "small", "--out", "runs/x", "--learners=rm,rm-frames"]
    assert rerun_command(argv, Path("y"), learners=["rm-frames"]) == [
        "rlmlab", "run", "length", "--preset", "small", "--out=y", "--learners=rm-frames", "--quiet"]
    # The committed evaluation's runaway factor is pinned, over any the command gave.
    pinned = rerun_command([*argv, "--preset.eval_runaway_factor=2"], Path("y"), runaway_factor=8)
    assert pinned[-2:] == ["--preset.eval_runaway_factor=8", "--quiet"] and "--preset.eval_runaway_factor=2" not in pinned
    # A re-run runs on this machine, never on the Ray cluster a stored command names.
    for ray in (["--ray-address", "10.0.0.9:6379", "--ray-gpus-per-job", "1"],
                ["--ray-address=10.0.0.9:6379", "--ray-gpus-per-job=1"]):
        assert rerun_command([*argv, *ray], Path("y")) == [
            "rlmlab", "run", "length", "--preset", "small", "--learners=rm,rm-frames", "--out=y", "--quiet"]
    assert stored_commands(FIXTURE) == [json.loads((FIXTURE / "commands.jsonl").read_text())["argv"]]


def test_a_sampled_rerun_trains_on_the_stored_split_and_decodes_the_first_of_each_bin(fresh, tmp_path):
    """`--sample` cuts the evaluation, not the split: the training data (hence the weights) are
    the full run's, and the expressions decoded are the first N of each bin, decoded as the
    full run decoded them."""
    out = tmp_path / "sampled"
    assert main(["reproduce", str(FIXTURE), "--out", str(out), "--sample", "1", "--strict"]) == 0
    for name in ("train", "val", "eval"):
        assert (pq.read_table(out / "data" / "length-96" / f"{name}.parquet")
                .equals(pq.read_table(fresh / "data" / "length-96" / f"{name}.parquet"))), name
    for run in RUNS:
        a, b = (load_file(str(f / run / "best" / "model.safetensors")) for f in (out, fresh))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        full = decoded(fresh, run)
        assert decoded(out, run) == [full[i] for i in range(40) if i % 4 == 0]  # 10 bins of 4


def test_a_sampled_evaluation_is_redone_when_the_whole_set_is_asked(tmp_path):
    out = tmp_path / "run"
    argv = ["run", "length", "--preset", "smoke", "--out", str(out), "--learners", "rm", "--threads", "1", "--quiet"]
    assert main(argv + ["--preset.eval_sample=1"]) == 0
    assert len(read_results(out / "length-96" / "rm" / "eval")) == 10
    assert main(argv) == 0
    assert len(read_results(out / "length-96" / "rm" / "eval")) == 40


@pytest.mark.parametrize("damage, message", [
    ({"commands.jsonl": None}, "no commands.jsonl"),
    ({"commands.jsonl": "{not json\n"}, "line 1 is not a stored command"),
    ({"commands.jsonl": '{"argv": ["rm", "-rf", "/"]}\n'}, "line 1 is not an `rlmlab run` command"),
    ({"experiment.json": None}, "no experiment.json"),
])
def test_a_damaged_results_folder_gets_one_line(tmp_path, capsys, damage, message):
    folder = tmp_path / "results"
    shutil.copytree(FIXTURE, folder)
    for name, text in damage.items():
        (folder / name).unlink() if text is None else (folder / name).write_text(text)
    assert main(["reproduce", str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_the_fresh_run_needs_a_folder_of_its_own(capsys):
    assert main(["reproduce", str(FIXTURE), "--out", str(FIXTURE / "again")]) == 2
    assert "needs a folder of its own" in capsys.readouterr().err
    assert not (FIXTURE / "again").exists()

"""The command line itself: which commands stay off torch, --version, suggestions for mistyped
options, and the old spellings of flags that are still accepted."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlmlab.cli import main
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / "depth-5-small"  # a small committed experiment: an eval set, a probe


def _without_torch(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run `rlmlab ARGV` in a fresh interpreter, then fail unless torch stayed out of it."""
    code = ("import sys\nfrom rlmlab.cli import main\ntry:\n    rc = main(sys.argv[1:])\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def experiment_copy(tmp_path_factory):
    """A copy of a committed experiment, so that `report` and `view` write outside results/."""
    dest = tmp_path_factory.mktemp("light") / "exp"
    shutil.copytree(RESULTS, dest)
    return dest


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["trace", "add(square(2),3)"],
                                  ["trace", "--json", "-"], ["train", "--help"], ["eval", "--help"],
                                  ["run", "--help"]])
def test_light_commands_do_not_import_torch(argv, tmp_path):
    proc = _without_torch(argv, tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_report_view_and_export_do_not_import_torch(experiment_copy, tmp_path):
    for argv in (["report", str(experiment_copy)],
                 ["view", str(experiment_copy), "--out", str(tmp_path / "view"), "--quiet", "--limit", "3"],
                 ["export", str(experiment_copy), str(tmp_path / "export")]):
        proc = _without_torch(argv, tmp_path)
        assert proc.returncode == 0, (argv, proc.stderr)
    assert (tmp_path / "view" / "index.html").is_file()
    assert (tmp_path / "export" / "report" / "report.json").is_file()


def test_a_command_that_needs_torch_is_caught_by_the_check(tmp_path):
    # The check above can fail: a command that loads a model does import torch.
    (tmp_path / "e.txt").write_text("add(1,2)\n")
    proc = _without_torch(["eval", "--oracle", "rm", "--data", "e.txt", "--out", "o", "--quiet"], tmp_path)
    assert proc.returncode != 0 and "torch was imported" in proc.stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("rlmlab ") and out.strip() != "rlmlab"


@pytest.mark.parametrize("argv, hint", [
    (["train", "--out", "x", "--model.n_layr=3"], "--model.n_layr: did you mean --model.n_layer?"),
    (["train", "--out", "x", "--modle.n_layer", "3"], "did you mean --model.n_layer?"),
    (["train", "--out", "x", "--lr=3e-4"], "--lr: did you mean --train.lr?"),
    (["run", "iid", "--out", "x", "--preset.pool_nn=5"], "did you mean --preset.pool_n?"),
    (["data", "pool", "--out", "x", "--seeed", "3"], "--seeed: did you mean --seed?"),
    (["trace", "add(1,2)", "--jsn"], "--jsn: did you mean --json?"),
])
def test_a_mistyped_option_names_the_closest_one(argv, hint, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2  # a usage error is one line, returned as status 2 (cli.Parser)
    err = capsys.readouterr().err
    assert hint in err and "unrecognized arguments" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("argv, hint", [
    (["trac", "add(1,2)"], "unknown command 'trac'; did you mean trace?"),
    (["--version", "evl"], "unknown command 'evl'; did you mean eval?"),
    (["xyzzy"], "unknown command 'xyzzy'; commands: demo, run,"),
])
def test_a_mistyped_command_names_the_closest_one(argv, hint, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert hint in err and len(err.strip().splitlines()) == 1


def test_an_option_unlike_any_gets_no_suggestion(capsys):
    assert main(["trace", "add(1,2)", "--zzzzzzzz"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzzzz" in err and "did you mean" not in err


def test_a_mistyped_config_key_names_the_closest_one(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"n_layr": 3}}))
    assert main(["train", "--out", str(tmp_path / "run"), "--config", str(cfg), "--max-steps", "1"]) == 2
    assert "unknown config key 'model.n_layr' (did you mean 'model.n_layer'?)" in capsys.readouterr().err
    assert main(["run", "iid", "--out", str(tmp_path / "exp"),
                 "--learner-setting", "per_learner.rm.train.batch_sze=4"]) == 2
    assert "did you mean 'train.batch_size'?" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "exp").exists()


def test_eval_max_depth_default_is_the_decoders():
    from rlmlab.cli.eval_cmd import MAX_DEPTH
    from rlmlab.decoding.driver import Limits

    assert MAX_DEPTH == Limits().max_depth


def _parse(argv: list[str]):
    from rlmlab.cli import build_parser

    return build_parser().parse_args(argv)


@pytest.mark.parametrize("flag", ["--learner", "--view"])  # --view: the old spelling
def test_train_takes_the_learner_under_both_spellings(flag):
    from rlmlab.cli.train_cmd import resolve_config

    cfg = resolve_config(_parse(["train", "--out", "x", flag, "cot", "--max-steps", "1"]))
    assert cfg.data.learner == "cot"


@pytest.mark.parametrize("flag", ["--learners", "--views"])  # --views: the old spelling
def test_run_takes_the_learners_under_both_spellings(flag):
    assert _parse(["run", "iid", "--out", "x", flag, "rm,rm-frames"]).learners == "rm,rm-frames"


@pytest.mark.parametrize("argv", [["--oracle", "cot"], ["--oracle", "--view", "cot"], ["--view", "cot", "--oracle"]])
def test_eval_oracle_takes_the_learner_under_both_spellings(argv, tmp_path, capsys):
    data = tmp_path / "e.txt"
    data.write_text("add(1,2)\nsquare(double(3))\n")
    assert main(["eval", *argv, "--data", str(data), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert (summary["learner"], summary["n"], summary["accuracy"]) == ("cot", 2, 1.0)


def test_eval_oracle_refuses_two_different_learners(tmp_path, capsys):
    assert main(["eval", "--oracle", "rm", "--view", "cot", "--data", str(tmp_path / "e.txt")]) == 2
    assert "name two learners" in capsys.readouterr().err


def test_eval_groups_by_the_old_name_of_a_renamed_field(tmp_path, capsys):
    data = tmp_path / "e.txt"
    data.write_text("add(1,2)\nsquare(double(3))\nadd(square(double(2)),1)\n")
    for by in ("n_frames", "n_frame_examples"):
        assert main(["eval", "--oracle", "rm", "--data", str(data), "--out", str(tmp_path / by), "--quiet",
                     "--by", by]) == 0
        assert "n_frame_examples" in capsys.readouterr().out
    from rlmlab.measuring.result_files import read_results

    rows = read_results(tmp_path / "n_frames")
    assert [r["n_frame_examples"] for r in rows] == [PAPER.execute(r["expr"]).n_frame_examples for r in rows] == [1, 3, 5]


def test_every_committed_run_config_still_loads_and_resumes_under_its_keys():
    # Saved configs (results/, the released checkpoints) keep the keys they were written with;
    # `--resume` and `rlmlab train --config` read them back.
    # A key renamed since (`OLD_KEYS`: data.view is data.learner) is read under its new name.
    from rlmlab.learning.config import OLD_KEYS, RunConfig, apply_dict, load_config_file

    paths = sorted([*ROOT.glob("results/**/config.json"), *ROOT.glob("rlmlab/released/**/config.json")])
    assert len(paths) > 20
    old = 0
    for path in paths:
        saved = json.loads(path.read_text())
        cfg = load_config_file(path)
        assert cfg == apply_dict(RunConfig(), saved, where=str(path))
        old += "view" in saved["data"]
        saved = {s: {OLD_KEYS.get(s, {}).get(k, k): v for k, v in d.items()} for s, d in saved.items()}
        loaded = json.loads(json.dumps(cfg.to_dict()))  # tuples as the lists JSON writes
        assert {s: {k: v for k, v in d.items() if k in saved[s]} for s, d in loaded.items()} == saved
    assert old > 20  # the committed configs were written before the rename


def test_the_command_list_shows_each_modules_own_help_line():
    import argparse

    from rlmlab.cli import COMMANDS, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {c.dest: c.help for c in sub._choices_actions} == COMMANDS


def test_running_one_command_builds_only_its_parser_in_full(capsys):
    from rlmlab.cli import UsageError, build_parser

    parser = build_parser("trace")
    assert parser.parse_args(["trace", "--json", "add(1,2)"]).json is True
    with pytest.raises(UsageError) as e:  # the other commands are listed by name only
        parser.parse_args(["train", "--out", "x"])
    assert "unrecognized arguments: --out x" in str(e.value)


def documented_commands():
    """Every `rlmlab ...` line of a shell block in the README, docs/ and the results' READMEs
    (continuations joined, `&&` and pipes split), with the error line the block prints after
    it, if any. Lines with shell variables or elided arguments (`...`) are left out."""
    import re
    import shlex

    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "results").glob("*/README.md"))]
    for path in files:
        for block in re.findall(r"```[a-z]*\n(.*?)```", path.read_text(), re.S):
            lines = [line.strip().removeprefix("$ ") for line in block.replace("\\\n", " ").splitlines()]
            for i, line in enumerate(lines):
                after = lines[i + 1] if i + 1 < len(lines) else ""
                error = after if re.match(r"rlmlab [a-z]+: error: ", after) else None
                if re.match(r"rlmlab [a-z]+: ", line) or not (line.startswith("rlmlab ") or "&& rlmlab " in line):
                    continue  # a command's output, or no command
                lexer = shlex.shlex(line, posix=True, punctuation_chars="&;|")
                lexer.whitespace_split, lexer.commenters = True, "#"
                words, parts = list(lexer), [[]]
                for word in words:  # commands joined by && ; |
                    parts.append([]) if word in ("&&", ";", "|", "||") else parts[-1].append(word)
                for argv in parts:
                    if argv[:1] == ["rlmlab"] and not any(c in a for a in argv for c in "$<") and "..." not in argv:
                        yield pytest.param(argv[1:], error, id=f"{path.name}:{' '.join(argv[1:3])}")


@pytest.mark.parametrize("argv, error", list(documented_commands()))
def test_every_documented_command_line_parses(argv, error, capsys):
    """A renamed flag leaves no stale command in the docs; a documented error is the one printed."""
    from rlmlab.cli import build_parser

    if error is None:
        assert build_parser().parse_args(argv).command == argv[0]
    else:
        assert main(argv) == 2
        assert capsys.readouterr().err.strip() == error


def test_the_documentation_shows_commands():
    commands = list(documented_commands())
    assert len(commands) > 40 and sum(p.values[1] is not None for p in commands) >= 2

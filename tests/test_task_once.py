"""A command reads its task file once and passes the resolved `Task` down: data, validation,
training, the resume check and evaluation all use that one object."""

import rlmlab.task.taskfile as taskfile
from rlmlab.cli import main
from rlmlab.task.taskfile import TASKS_DIR


def test_train_resume_and_eval_each_read_the_task_file_once(tmp_path, monkeypatch, capsys, one_torch_thread):
    task_file = tmp_path / "mine.toml"
    task_file.write_text((TASKS_DIR / "mod7.toml").read_text().replace('name = "mod7"', 'name = "mine"'))
    pool = tmp_path / "pool.parquet"
    assert main(["data", "pool", "--task", str(task_file), "--n", "300", "--seed", "1", "--out", str(pool),
                 "--quiet", "--workers", "1"]) == 0
    reads = []
    parse = taskfile.task_from_toml
    monkeypatch.setattr(taskfile, "task_from_toml", lambda *a, **k: reads.append(a[1:]) or parse(*a, **k))

    run = tmp_path / "run"
    common = ["train", "--learner", "rm", "--preset", "tiny", "--out", str(run), "--quiet", "--data", str(pool),
              "--data.val_size=50", "--train.answer_eval=5", "--data.cache_dir=", "--data.workers=1"]
    assert main([*common, "--task", str(task_file), "--max-steps", "2"]) == 0
    assert len(reads) == 1, reads  # not again for the examples, the validation decoder or the trainer
    reads.clear()
    assert main([*common, "--resume", "--max-steps", "4"]) == 0  # the task the resumed run's config records
    assert len(reads) == 1, reads
    reads.clear()
    assert main(["eval", str(run), "--data", str(pool), "--limit", "5", "--quiet", "--max-new-tokens", "20"]) == 0
    assert len(reads) == 1, reads  # the checkpoint's task, then the data and the decoder read that one

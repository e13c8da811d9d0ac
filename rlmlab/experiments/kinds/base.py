"""The interface every experiment kind implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from rlmlab.errors import ConfigError, DataError

if TYPE_CHECKING:
    from rlmlab.task.taskfile import Task


def meta_task_digest(meta: dict) -> str:
    """The task digest an `experiment.json` records (none: the paper's, as before tasks were recorded)."""
    from rlmlab.task.taskfile import task_of_meta

    return task_of_meta(meta.get("task"), "experiment.json")


class ExperimentKind(ABC):
    """One kind of experiment: how it plans its jobs and names their folders, what its
    `experiment.json` holds, how its tables and figures are built from saved results, and how two
    exports of it merge. `rlmlab run`, `rlmlab report` and `rlmlab export` know nothing else about
    a kind.

    A kind that `rlmlab run` cannot plan (a recipe comparison: a folder of `rlmlab train` runs)
    leaves `runnable` False and reports like any other."""

    name: str = ""
    runnable: bool = True
    options: tuple[str, ...] = ()
    """Keyword options of `plan` beyond the preset (`--threshold`, `--sizes`, `--constructions`)."""
    meta_fields: dict[str, type] = {}
    """Keys its `experiment.json` must hold, with their JSON types."""

    def identity(self, meta: dict) -> dict:
        """What two experiment folders must share to hold the same experiment: an export merges
        into, and a run resumes in, a folder only when these agree: the kind, the preset, the pool
        its data is drawn from and the task (a folder from before tasks were recorded holds the
        paper's)."""
        p = meta.get("preset") if isinstance(meta.get("preset"), dict) else {}
        return {"kind": meta.get("kind"), "preset": p.get("name"), "pool": [p.get("pool_n"), p.get("pool_seed")],
                "task": meta_task_digest(meta)}

    def planned_identity(self, preset, task: Task, **options) -> dict:
        """`identity` of the experiment a `plan` with these arguments would write, known before
        any data is built (`task`: the preset's, as the command resolved it)."""
        return {"kind": self.name, "preset": preset.name, "pool": [preset.pool_n, preset.pool_seed],
                "task": task.digest}

    def plan(self, preset, out: Path, learners: tuple[str, ...], progress: bool = True, *, task: Task,
             **options) -> list:
        """Build the data under `out/data/`, write `experiment.json`, and return the jobs of `task`
        (the preset's, as the command resolved it)."""
        raise ConfigError(f"`rlmlab run` does not plan {self.name} experiments")

    def job_names(self, out: Path, meta: dict) -> list[str]:
        """The experiment's job folders under `out`, in the order of its tables."""
        return []

    @abstractmethod
    def report(self, out: Path, meta: dict, dest: Path) -> dict:
        """Write this kind's tables and figures into `dest`; return every number shown."""

    def merge_meta(self, old: dict, new: dict) -> dict:
        """`new`'s description, extended by what `old` planned that `new` did not (both have the
        same `identity`)."""
        return dict(new)

    def absorb(self, meta: dict) -> dict | None:
        """Another kind's experiment description (`meta`) as one of this kind, when a folder of
        this kind can hold that experiment's runs as they are (a threshold sweep holds a
        single-threshold experiment of the same preset); else None. `rlmlab export` merges such
        an experiment into a folder of this kind."""
        return None

    def absorb_command(self, line: str, meta: dict) -> str:
        """A line of an absorbed experiment's commands.jsonl, as this kind's command for the same runs."""
        return line

    def planned_before(self, out: Path, key: str) -> set:
        """What the runs that shared the folder `out` before planned under `key` of its
        experiment.json (sizes, constructions); none in a folder of another kind, which
        `write_meta` refuses."""
        from rlmlab.experiments.folder import read_experiment_json

        if not (out / "experiment.json").exists():
            return set()
        old = read_experiment_json(out)
        if old["kind"] != self.name:
            return set()
        self.check_meta(old, out / "experiment.json")
        return set(old.get(key, ()))

    def check_meta(self, meta: dict, path: Path) -> None:
        for key, kind in self.meta_fields.items():
            if not isinstance(meta.get(key), kind):
                raise DataError(f"{path}: a {self.name} experiment needs '{key}' ({kind.__name__})")

"""Options that the commands which decode with a run's checkpoint (`rlmlab eval`, `probe`,
`frames`) share."""

from __future__ import annotations

from rlmlab.task.taskfile import add_task_option


def add_decoding_options(p) -> None:
    """`--threads`, `--quiet` and `--task` on the argparse subparser `p`."""
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_task_option(p)

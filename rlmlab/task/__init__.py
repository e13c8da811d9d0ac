"""rlmlab, the task: functions, expressions, their execution into traces, frames, sampling, pools, vocabulary."""

# The paper's library becomes the default of `rlmlab.task.expr` as it is built, before any module
# of the package is used.
from rlmlab.task import library as _library  # noqa: E402, F401

"""rlmlab, the task: functions, expressions, their execution into traces, frames, sampling, pools, vocabulary."""

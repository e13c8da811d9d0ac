"""A run's examples: expressions read from parquet, split into training and validation, built
into one learner's examples, and fitted to the model's positional table.

    split = prepare_data(cfg.data, task)                 # pool -> train/val examples of one learner
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlmlab.errors import ConfigError, DataError
from rlmlab.learning.config import DataSettings
from rlmlab.learning.examples import ExampleSet, build_examples
from rlmlab.task.pool import read_pool
from rlmlab.task.taskfile import Task


@dataclass
class DataSplit:
    """A learner's training and validation examples, and the validation expressions themselves
    (for greedy final-answer validation)."""

    train: ExampleSet
    val: ExampleSet
    val_exprs: list[str]


def read_expr_column(path: str | Path, task: Task) -> list[str]:
    """The `expr` column of a pool or expression-set parquet of `task`."""
    return read_pool(path, task=task).column("expr").to_pylist()


def prepare_data(data: DataSettings, task: Task, position_index: str | None = None) -> DataSplit:
    """Read the expressions, split off validation unless a file gives it, and build the
    configured learner's training and validation examples (cached, see `build_examples`).
    `task` is `data.task` as the command resolved it; `position_index` is the model's
    (`model.position_index`)."""
    if data.train is None:
        raise ConfigError("data.train: no training data given (--data pool.parquet)")
    vocab = task.vocab
    exprs = read_expr_column(data.train, task)
    rows = [f"{data.train}: row {i}" for i in range(len(exprs))]  # for errors: rows of the user's files
    if data.val is not None:
        val_exprs, train_exprs = read_expr_column(data.val, task), exprs
        val_rows, train_rows = [f"{data.val}: row {i}" for i in range(len(val_exprs))], rows
    else:
        if len(exprs) <= data.val_size:
            raise DataError(f"{data.train}: {len(exprs)} expressions, too few to split off "
                            f"data.val_size={data.val_size} for validation")
        is_val = np.zeros(len(exprs), dtype=bool)
        is_val[np.random.default_rng(data.val_seed).permutation(len(exprs))[:data.val_size]] = True
        val_exprs = [e for e, v in zip(exprs, is_val) if v]
        train_exprs = [e for e, v in zip(exprs, is_val) if not v]
        val_rows = [r for r, v in zip(rows, is_val) if v]
        train_rows = [r for r, v in zip(rows, is_val) if not v]
    if data.train_size is not None:
        if data.train_size > len(train_exprs):
            raise DataError(f"data.train_size={data.train_size} but only {len(train_exprs)} training expressions")
        train_exprs = train_exprs[:data.train_size]
    workers = data.workers or os.cpu_count() or 1
    cache = data.resolved_cache_dir()
    return DataSplit(build_examples(train_exprs, data.learner, vocab, workers, cache, where=train_rows, task=task,
                                    position_index=position_index),
                     build_examples(val_exprs, data.learner, vocab, workers, cache, where=val_rows, task=task,
                                    position_index=position_index),
                     val_exprs)


def fit_to_block(data: ExampleSet, block_size: int | None, drop: bool, what: str) -> tuple[ExampleSet, int]:
    """Remove examples that read beyond the positional table (an example of n tokens reads n-1);
    `block_size` None (an encoding without a table) keeps every example."""
    if block_size is None:
        return data, 0
    needed = data.positions_needed
    too_long = needed > block_size
    n = int(too_long.sum())
    if n and not drop:
        raise DataError(f"{n} {what} examples are longer than the model's block_size={block_size} "
                        f"(longest {int(needed.max())}); raise model.block_size or set data.drop_too_long")
    if n == len(data):
        raise DataError(f"every {what} example is longer than the model's block_size={block_size}")
    return data.select(~too_long), n

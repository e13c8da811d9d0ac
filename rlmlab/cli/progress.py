"""Progress bars for the long steps of a command: on a terminal, and not with --quiet."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def stages(quiet: bool) -> Iterator[Callable[[str, int | None, str], Callable[[int], None]] | None]:
    """Yields `stage(name, total, unit)`, which opens a bar on stderr (closing the previous one)
    and returns its update callback; yields None when `quiet` or when stderr is not a terminal
    (piped or redirected), so that logs hold no bar."""
    if quiet or sys.stderr is None or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    bars = []

    def stage(name: str, total: int | None, unit: str = "row") -> Callable[[int], None]:
        if bars:
            bars[-1].close()
        bars.append(tqdm(total=total, desc=name, unit=unit, dynamic_ncols=True))
        return bars[-1].update

    try:
        yield stage
    finally:
        for bar in bars:
            bar.close()

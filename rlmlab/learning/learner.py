"""A learner, resolved once from its name: what the model reads and how it is trained to read it.

CoT and RM are the same Transformer, trainer and decoder; they differ only in the observation
function. A `Learner` bundles what follows from a name such as "rm", "rm-frames", "cot",
"window:64" or "reduce":

- `observation`: the observation function (`rlmlab.learning.observe`), which decides what the model
  reads at every step, how training examples are cut and how the decoding driver moves;
- `packing`: how those examples become training sequences (`rlmlab.learning.views`: RM's examples are
  lane-packed, "rm-frames" keeps them one by one, any other observation trains on its plain
  examples);
- `row_length`: the base packed-row length of its training batches;
- `label`: its name in tables ("RM", "CoT", else the name itself).

The command line and the configs resolve a name with `learner(name)` (an unknown name is a
one-line ConfigError) and pass the object down; `as_learner` lets library functions take
either. Which learner is which is known only to `rlmlab.learning.observe` (the observations) and
`rlmlab.learning.views` (the packings registered by name).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from rlmlab.errors import ConfigError
from rlmlab.learning.observe import Observation, observer

PAPER_LEARNERS = ("rm", "cot")
"""The paper's two learners: what an experiment runs by default, first in every table."""


@dataclass(frozen=True)
class Learner:
    name: str
    """The name it was resolved from: `--learner`, `data.view`, run folders and result files use it."""
    observation: Observation
    """What the model reads (decides the training examples and the decoding driver)."""
    packing: object
    """`Execution -> list[Example]`: its training sequences (`rlmlab.learning.views.View`)."""

    @property
    def driver(self) -> str:
        """The canonical name of its observation: what `rlmlab.decoding.infer.generate` decodes in (every
        RM packing decodes with the stack driver, "rm")."""
        return self.observation.name

    @property
    def label(self) -> str:
        """Its name in tables: the observation's label for the observation's own packing
        ("RM", "CoT"), the name itself for any other packing ("rm-frames")."""
        return self.observation.label if self.name == self.observation.name else self.name

    @property
    def row_length(self) -> int:
        """Base packed-row length of its training batches (`data.row_len` overrides it)."""
        return self.observation.row_length

    def __repr__(self) -> str:
        return f"<learner {self.name}>"


@cache
def learner(name: str) -> Learner:
    """The learner called `name`; an unknown name or a bad parameter is a one-line ConfigError."""
    from rlmlab.learning.views import (
        get_view,  # the packings import the executor; resolve lazily
    )

    if not isinstance(name, str):
        raise ConfigError(f"a learner is named by its view, got {name!r}")
    return Learner(name, observer(name), get_view(name))


def as_learner(x: Learner | str) -> Learner:
    """A `Learner` as given, or the one a name resolves to."""
    return x if isinstance(x, Learner) else learner(x)

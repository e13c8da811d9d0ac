"""A learner, resolved once from its name: what the model reads and how it is trained to read it.

CoT and RM are the same Transformer, trainer and decoder; they differ only in the observation
function. A `Learner` bundles what follows from a name such as "rm", "rm-frames", "cot",
"window:64" or "reduce":

- `observation`: the observation function (`rlmlab.learning.observe`), which decides what the model
  reads at every step, how training examples are cut and how the decoding driver moves;
- `packing`: how those examples become training sequences (`rlmlab.learning.examples`: RM's examples are
  lane-packed, "rm-frames" keeps them one by one, any other observation trains on its plain
  examples);
- `row_length`: the base packed-row length of its training batches;
- `label`: its name in tables ("RM", "CoT", else the name itself);
- `encoding`: the position encoding its model uses when the name asks for one, as in
  "cot@rope" (`rlmlab.attention.positions`); the name without it is `base`, "cot". Experiments
  name learners this way (their run folders, tables and figures), and so do the summaries of
  `rlmlab eval`, `probe` and `frames` (`LoadedRun.named`); a run's config does not:
  `data.learner` is always the base name and `model.positions` the encoding.

The command line and the configs resolve a name with `get_learner(name)` (an unknown name is a
one-line ConfigError) and pass the object down; `as_learner` lets library functions take
either. Which learner is which is known only to `rlmlab.learning.observe` (the observations) and
`rlmlab.learning.examples` (the packings registered by name).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from rlmlab.attention.encodings import POSITION_LABELS, check_encoding
from rlmlab.errors import ConfigError
from rlmlab.learning.observe import Observation, observer

PAPER_LEARNERS = ("rm", "cot")
"""The paper's two learners: what an experiment runs by default, first in every table."""


@dataclass(frozen=True)
class Learner:
    name: str
    """The name it was resolved from: `--learner`, run folders and result files use it."""
    observation: Observation
    """What the model reads (decides the training examples and the decoding driver)."""
    packing: object
    """`Execution -> list[Example]`: its training sequences (`rlmlab.learning.examples.Packing`)."""
    encoding: str | None = None
    """The position encoding the name asks for ("cot@rope": "rope"); None: the run's `model.positions`."""

    @property
    def base(self) -> str:
        """The name without its encoding (`data.learner`): what its packing and observation are
        resolved from."""
        return self.name.partition("@")[0]

    @property
    def driver(self) -> str:
        """The canonical name of its observation: what `rlmlab.decoding.driver.generate` decodes in (every
        RM packing decodes with the stack driver, "rm")."""
        return self.observation.name

    @property
    def label(self) -> str:
        """Its name in tables: the observation's label for the observation's own packing
        ("RM", "CoT"), the name itself for any other packing ("rm-frames"); an encoding the name
        asks for follows in parentheses ("CoT (RoPE)")."""
        base = self.observation.label if self.base == self.observation.name else self.base
        return base if self.encoding is None else f"{base} ({POSITION_LABELS[self.encoding]})"

    @property
    def row_length(self) -> int:
        """Base packed-row length of its training batches (`data.row_len` overrides it)."""
        return self.observation.row_length

    def __repr__(self) -> str:
        return f"<learner {self.name}>"


@cache
def get_learner(name: str) -> Learner:
    """The learner called `name`: a base name ("rm", "cot", "window:64"), optionally with a
    position encoding after "@" ("cot@rope", "rm@alibi"); an unknown name or a bad parameter is
    a one-line ConfigError."""
    from rlmlab.learning.examples import (
        get_packing,  # the packings import the executor; resolve lazily
    )

    if not isinstance(name, str):
        raise ConfigError(f"a learner is named by a string, got {name!r}")
    base, at, encoding = name.partition("@")
    if at:
        check_encoding(encoding, f"learner {name!r}: the encoding after '@'")
    return Learner(name, observer(base), get_packing(base), encoding if at else None)


def as_learner(x: Learner | str) -> Learner:
    """A `Learner` as given, or the one a name resolves to."""
    return x if isinstance(x, Learner) else get_learner(x)

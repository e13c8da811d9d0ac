"""The constructions by name: the paper's six in table order, variants an experiment may also
run, and the two excluded ablations."""

from __future__ import annotations

from rlmlab.errors import ConfigError
from rlmlab.shortcuts.aggregates import LongRangeAggregate, NearAnswerAggregate, PositionWeightedAggregate, SiblingCopy
from rlmlab.shortcuts.construction import Construction
from rlmlab.shortcuts.copy_deep_return import CopyDeepReturn, OneToOneWrapper
from rlmlab.shortcuts.hidden_literal import HiddenLiteral, HiddenLiteralLate
from rlmlab.shortcuts.position_parity import PositionParity

CONSTRUCTIONS: dict[str, Construction] = {c.name: c for c in (
    CopyDeepReturn(), HiddenLiteral(), LongRangeAggregate(), NearAnswerAggregate(),
    PositionWeightedAggregate(), PositionParity())}
"""The six constructions of the paper's shortcut table, in table order."""
VARIANTS: dict[str, Construction] = {c.name: c for c in (HiddenLiteralLate(),)}
"""Constructions beyond the paper's six that pass the same validity checks, to test a reading
of one (`rlmlab run shortcuts --constructions NAME`); Table 3 lists them after the six."""
EXPERIMENT_CONSTRUCTIONS: dict[str, Construction] = {**CONSTRUCTIONS, **VARIANTS}
"""What `rlmlab run shortcuts` trains, in table order."""
ABLATIONS: dict[str, Construction] = {c.name: c for c in (SiblingCopy(), OneToOneWrapper())}
"""The two excluded variants; the validity checks reject both."""


def get_construction(name: str) -> Construction:
    """The construction or ablation called `name`; ConfigError naming the known ones if none is."""
    try:
        return {**EXPERIMENT_CONSTRUCTIONS, **ABLATIONS}[name]
    except KeyError:
        raise ConfigError(f"unknown shortcut construction {name!r}; known: "
                          f"{', '.join([*EXPERIMENT_CONSTRUCTIONS, *ABLATIONS])}") from None

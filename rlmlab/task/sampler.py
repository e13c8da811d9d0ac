"""The paper's expression generator ("Task and generator"), driven by an explicit RNG.

Root uniform over the library, or drawn with a task's root weights (a root returning T, as
`if_then_else`, picks int or bool uniformly); each
argument independently a literal with probability `p_lit`, else a sub-expression whose
function returns the required type; the root is level 1 and a call at `max_level` takes
only literals.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlmlab.task.expr import ANY, BOOL, BOOLS, INT, Call
from rlmlab.task.library import Library


@dataclass(frozen=True)
class GeneratorConfig:
    p_lit: float = 0.4
    """Probability that an argument is a literal rather than a sub-expression."""
    max_level: int = 3
    """Nesting level of the written expression at which calls take only literals (root = 1)."""

    def __post_init__(self):
        from rlmlab.errors import ConfigError

        if not 0.0 <= self.p_lit <= 1.0:
            raise ConfigError(f"p_lit must be in [0, 1], got {self.p_lit}")
        if self.max_level < 1:
            raise ConfigError(f"max_level must be >= 1, got {self.max_level}")


class ExpressionSampler:
    """Expressions from the paper's generator; `roots` restricts the root function (uniform over
    those names; default: the whole library), as the shortcut constructions do."""

    def __init__(self, library: Library, config: GeneratorConfig = GeneratorConfig(),
                 roots: list[str] | None = None, weights: list[float] | None = None):
        from rlmlab.errors import ConfigError

        self.library = library
        self.config = config
        names = [f.name for f in self.library]
        if roots is not None:
            unknown = [r for r in roots if r not in names]
            if unknown or not roots:
                raise ConfigError(f"roots: unknown function {', '.join(unknown) or '(none given)'}")
        self.roots = list(roots) if roots is not None else names
        if weights is not None and (len(weights) != len(self.roots) or not sum(weights) > 0
                                    or any(not w >= 0 for w in weights)):
            raise ConfigError("root weights: one non-negative weight per root, not all zero")
        self.weights = None if weights is None else list(weights)
        self.digits = self.library.digits
        self.by_type = {INT: self.library.returning(INT), BOOL: self.library.returning(BOOL)}

    def sample(self, rng: random.Random) -> Call:
        # Uniform roots draw with `choice`, as the paper's seed-42 pool was drawn.
        name = rng.choice(self.roots) if self.weights is None else rng.choices(self.roots, self.weights)[0]
        fn = self.library[name]
        ret = rng.choice((INT, BOOL)) if fn.return_type == ANY else fn.return_type
        return self._fill(rng, name, ret, 1)

    def _fill(self, rng: random.Random, name: str, ret: str, level: int) -> Call:
        fn = self.library[name]
        return Call(name, tuple(self._arg(rng, ret if t == ANY else t, level) for t in fn.arg_types))

    def _arg(self, rng: random.Random, want: str, level: int):
        if level >= self.config.max_level or rng.random() < self.config.p_lit:
            return rng.choice(self.digits if want == INT else BOOLS)
        return self._fill(rng, rng.choice(self.by_type[want]), want, level + 1)

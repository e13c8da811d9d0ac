"""The names of the position encodings, torch-free for configs and learner names; what each
one does is `rlmlab.attention.positions`."""

from __future__ import annotations

from rlmlab.errors import ConfigError

POSITION_ENCODINGS = ("learned", "none", "rope", "alibi")
"""The values of `model.positions`; "learned" is the paper's and the default."""
POSITION_LABELS = {"learned": "learned", "none": "NoPE", "rope": "RoPE", "alibi": "ALiBi"}
"""How tables name each encoding."""


def check_encoding(name, key: str = "model.positions") -> str:
    if name not in POSITION_ENCODINGS:
        raise ConfigError(f"{key} must be one of {', '.join(POSITION_ENCODINGS)}, got {name!r}")
    return name

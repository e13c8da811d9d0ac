"""Errors a user can cause. The CLI prints any `RlmlabError` on one line and exits 2."""


class RlmlabError(Exception):
    """Base class: bad input from a user (expression, config, data file, checkpoint)."""


class ExprError(RlmlabError):
    """A written expression that does not parse or type-check; `pos` is a 0-based character offset."""

    def __init__(self, message: str, pos: int | None = None, text: str | None = None):
        self.message, self.pos, self.text = message, pos, text
        where = f"at column {pos + 1}: " if pos is not None else ""
        super().__init__(f"{where}{message}" + (f" in {text!r}" if text is not None else ""))


class LibraryError(RlmlabError):
    """A function library whose definitions are inconsistent."""


class TaskError(RlmlabError):
    """A task file (or built-in task name) that is missing, malformed or not well posed."""


class VocabError(RlmlabError):
    """A token that is not in the vocabulary, or a vocabulary file that does not match."""


class DataError(RlmlabError):
    """A data file (pool, expression set) that is missing, malformed or inconsistent."""


class ConfigError(RlmlabError):
    """A configuration with unknown keys, wrong types or invalid values."""


class CheckpointError(RlmlabError):
    """A run folder or checkpoint that is missing, incomplete or inconsistent."""


class TrainingDiverged(RlmlabError):
    """A training step whose loss or gradient is not finite: the run stops before it is applied."""

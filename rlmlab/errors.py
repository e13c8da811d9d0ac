"""Errors a user can cause. The CLI prints any `RlmlabError` on one line and exits 2."""

ECHO_CHARS = 200  # user text echoed in an error is cut to about this many characters


class RlmlabError(Exception):
    """Base class: bad input from a user (expression, config, data file, checkpoint)."""


class ExprError(RlmlabError):
    """A written expression that does not parse or type-check; `pos` is a 0-based character offset."""

    def __init__(self, message: str, pos: int | None = None, text: str | None = None):
        self.message, self.pos, self.text = message, pos, text
        where = f"at column {pos + 1}: " if pos is not None else ""
        if len(message) > ECHO_CHARS:  # it quotes a token of the input
            message = f"{message[:ECHO_CHARS]}... ({len(message):,} characters)"
        super().__init__(f"{where}{message}" + (f" in {_excerpt(text, pos)}" if text is not None else ""))



def _excerpt(text: str, pos: int | None) -> str:
    """`text` quoted, or for a long text the stretch around `pos`, so that an error stays one
    short line whatever the input."""
    if len(text) <= ECHO_CHARS:
        return repr(text)
    at = min(max(pos or 0, 0), len(text))
    start = max(0, at - ECHO_CHARS // 2)
    piece = text[start:start + ECHO_CHARS]
    return (f"{'...' if start else ''}{piece!r}{'...' if start + ECHO_CHARS < len(text) else ''} "
            f"(of {len(text):,} characters)")


class LibraryError(RlmlabError):
    """A function library whose definitions are inconsistent."""


class TaskError(RlmlabError):
    """A task file (or built-in task name) that is missing, malformed or not well posed."""


class VocabError(RlmlabError):
    """A token that is not in the vocabulary, or a vocabulary file that does not match."""


class DataError(RlmlabError):
    """A data file (pool, expression set) that is missing, malformed or inconsistent."""


class TraceError(DataError, ValueError):
    """A token sequence that is not a legal call/return trace (or trace prefix); `pos` is the
    index of the first token that no legal trace has there. Also a ValueError, which callers of
    the replay catch."""

    def __init__(self, reason: str, pos: int | None = None):
        self.reason, self.pos = reason, pos
        super().__init__(f"not a legal trace at token {pos}: {reason}" if pos is not None
                         else f"not a legal trace: {reason}")


class NoResultsError(DataError):
    """An experiment folder with nothing evaluated yet, so nothing to report."""


class ConfigError(RlmlabError):
    """A configuration with unknown keys, wrong types or invalid values."""


class CheckpointError(RlmlabError):
    """A run folder or checkpoint that is missing, incomplete or inconsistent."""


class TrainingDiverged(RlmlabError):
    """A training step whose loss or gradient is not finite: the run stops before it is applied."""

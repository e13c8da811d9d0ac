"""The vocabulary: named tokens, ids derived from the task's library, saved with data and checkpoints."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from rlmlab.errors import VocabError
from rlmlab.safeio import parse_json
from rlmlab.task.expr import BOOLS

CALL, END_CALL, RETURN, END_RETURN = "<call>", "</call>", "<return>", "</return>"
CONTROL = (CALL, END_CALL, RETURN, END_RETURN)
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)  # model-level; never part of a trace
ASSIGN, RETURN_KW = ":=", "return"
SYNTAX = ("(", ")", ",", ASSIGN, RETURN_KW)


class Vocab:
    """Token <-> id. Unknown tokens raise; there is no silent UNK id."""

    def __init__(self, tokens: Sequence[str]):
        if len(set(tokens)) != len(tokens):
            raise VocabError("vocabulary has duplicate tokens")
        missing = [t for t in SPECIALS + CONTROL + SYNTAX if t not in tokens]
        if missing:
            raise VocabError(f"vocabulary lacks required tokens {missing}")
        self.tokens: tuple[str, ...] = tuple(tokens)
        self.ids: dict[str, int] = {t: i for i, t in enumerate(self.tokens)}
        self.pad_id, self.bos_id, self.eos_id = (self.ids[t] for t in SPECIALS)
        self.call_id, self.end_call_id, self.return_id, self.end_return_id = (self.ids[t] for t in CONTROL)

    @classmethod
    def from_library(cls, library) -> "Vocab":
        return cls(SPECIALS + CONTROL + SYNTAX + library.digits + BOOLS + library.param_names
                   + tuple(f.name for f in library))

    def __len__(self) -> int:
        return len(self.tokens)

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocab) and self.tokens == other.tokens

    def __hash__(self) -> int:
        return hash(self.tokens)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        ids = self.ids
        try:
            return [ids[t] for t in tokens]
        except KeyError as e:
            raise VocabError(f"unknown token {e.args[0]!r}") from None

    def decode(self, ids: Iterable[int]) -> list[str]:
        toks = self.tokens
        try:
            return [toks[i] for i in ids]
        except (IndexError, TypeError):
            raise VocabError("id outside the vocabulary") from None

    def to_json(self) -> str:
        return json.dumps({"tokens": list(self.tokens)})

    @classmethod
    def from_json(cls, text: str | bytes) -> "Vocab":
        data = parse_json(text, "vocabulary JSON", VocabError)  # bounded: it may come from a file's metadata
        try:
            toks = data["tokens"]
        except (KeyError, TypeError):
            raise VocabError("vocabulary JSON must be an object with a 'tokens' list") from None
        if not isinstance(toks, list) or not all(isinstance(t, str) for t in toks):
            raise VocabError("vocabulary 'tokens' must be a list of strings")
        return cls(toks)

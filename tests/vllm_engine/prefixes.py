"""Checks an answer that ran out of tokens: it must still be a valid prefix of its grammar,
or the plugin let a wrong token through that a finished answer would have shown.

A fresh matcher of the grammar (compiled as the requests ask: backend auto, unenforced
keywords allowed and declared) takes the answer's token ids, or its text byte by byte where
only the text came back (the server); every one must be accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

import grammarmask as gm
from grammarmask.tools.conformance import byte_token_ids


class PrefixChecker:
    """Valid-prefix checks on one vocabulary; compiled grammars are cached."""

    def __init__(self, vocab: gm.Vocabulary) -> None:
        self._compiler = gm.GrammarCompiler(vocab, timeout_s=120)
        self._byte_ids = byte_token_ids(vocab)
        self._stop_ids = set(vocab.stop_token_ids)

    def tokens(self, grammar: gm.Grammar, token_ids: Sequence[int]) -> str:
        """'valid' when every token is accepted in turn, else which one is not. A stop
        token at the end is left out: that is how the plugin ends a request that failed."""
        if token_ids and token_ids[-1] in self._stop_ids:
            token_ids = token_ids[:-1]
        refused = self._refused_at(grammar, token_ids)
        if refused is None:
            return "valid"
        return f"token {refused} (id {token_ids[refused]}) is not allowed by the grammar"

    def text(self, grammar: gm.Grammar, text: str) -> str:
        """'valid' when every byte of `text` is accepted in turn, else where it stops."""
        data = text.encode("utf-8")
        refused = self._refused_at(grammar, [self._byte_ids[byte] for byte in data])
        if refused is None:
            return "valid"
        return f"not a prefix of the grammar: byte {refused} of {data[: refused + 1]!r}"

    def _refused_at(self, grammar: gm.Grammar, token_ids: Sequence[int]) -> int | None:
        matcher = self._compiler.compile(grammar, "auto", allow_unenforced=True).matcher()
        for position, token_id in enumerate(token_ids):
            if not matcher.accept(token_id):
                return position
        return None

    def close(self) -> None:
        self._compiler.close()

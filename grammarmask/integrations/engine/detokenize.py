"""Streaming text from token bytes without ever emitting half a UTF-8 character."""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from ...vocabulary import Vocabulary


class IncrementalDetokenizer:
    """Incomplete trailing bytes are held back until they complete; invalid bytes become
    U+FFFD at once (byte-level tokens often split characters)."""

    def __init__(self, vocab: Vocabulary) -> None:
        self._vocab = vocab
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_ids: Iterable[int]) -> str:
        """The text that became complete with these tokens."""
        return self._decoder.decode(self._vocab.decode(token_ids))

    def finish(self) -> str:
        """Flush: bytes still held back are invalid at the end of the stream."""
        return self._decoder.decode(b"", final=True)

"""Token id -> exact bytes, built from real tokenizers.

Grammar engines match bytes, so every constructor here recovers the bytes a token really
produces (byte-level BPE alphabets, byte-fallback pieces, tiktoken ranks). Special tokens and
stop tokens get no bytes at all: they can never be produced as text inside a grammar.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from .errors import VocabularyError

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted (char -> byte)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


def _decode_byte_level(piece: str) -> bytes:
    alphabet = _byte_level_alphabet()
    try:
        return bytes(alphabet[ch] for ch in piece)
    except KeyError as exc:
        raise VocabularyError(
            f"token {piece!r} has character {exc.args[0]!r} outside the byte-level alphabet"
        ) from None


def _decode_metaspace(piece: str) -> bytes:
    fallback = _BYTE_FALLBACK.match(piece)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


def _decoder_types(decoder: Mapping[str, Any] | None) -> set[str]:
    if not decoder:
        return set()
    if decoder.get("type") == "Sequence":
        return {str(d.get("type")) for d in decoder.get("decoders", [])}
    return {str(decoder.get("type"))}


class Vocabulary:
    """A model's token table as the grammar backends need it.

    `size` is the logits width, which may exceed the number of token ids (padding ids are
    never allowed). `stop_token_ids` are explicit, never guessed from token text.
    """

    def __init__(
        self,
        token_bytes: Sequence[bytes | None],
        *,
        special_token_ids: Iterable[int] = (),
        stop_token_ids: Iterable[int],
        logits_width: int | None = None,
        token_names: Mapping[int, str] | None = None,
    ) -> None:
        n_tokens = len(token_bytes)
        if n_tokens == 0:
            raise VocabularyError("the tokenizer has no tokens")
        size = n_tokens if logits_width is None else int(logits_width)
        if size < n_tokens:
            raise VocabularyError(
                f"logits width {size} is smaller than the tokenizer's {n_tokens} token ids"
            )
        stops = tuple(dict.fromkeys(int(t) for t in stop_token_ids))
        if not stops:
            raise VocabularyError(
                "no stop token: pass stop_token_ids (the tokenizer names no EOS token)"
            )
        for token_id in stops:
            if not 0 <= token_id < n_tokens:
                raise VocabularyError(
                    f"stop token id {token_id} is outside the token table [0, {n_tokens})"
                )
        specials = {int(t) for t in special_token_ids}
        for token_id in specials:
            if not 0 <= token_id < n_tokens:
                raise VocabularyError(
                    f"special token id {token_id} is outside the token table [0, {n_tokens})"
                )
        for token_id, token in enumerate(token_bytes):
            if token is None:
                specials.add(token_id)
            elif not isinstance(token, bytes):
                raise VocabularyError(
                    f"token {token_id} is {type(token).__name__} {token!r}; token bytes must be "
                    "bytes (or None for a token without text)"
                )
        specials.update(stops)
        self._bytes: tuple[bytes, ...] = tuple(
            b"" if i in specials else bytes(b or b"") for i, b in enumerate(token_bytes)
        )
        self.special_token_ids: frozenset[int] = frozenset(specials)
        self.stop_token_ids: tuple[int, ...] = stops
        self.size: int = size
        self._names = dict(token_names or {})

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_tokenizer_json(
        cls,
        path: str | Path,
        logits_width: int | None = None,
        *,
        stop_token_ids: Iterable[int] = (),
    ) -> Vocabulary:
        """Load a Hugging Face tokenizer.json; EOS comes from a tokenizer_config.json beside it."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise VocabularyError(f"cannot read tokenizer file {path}: {exc}") from None
        eos_ids: list[int] = []
        config = path.with_name("tokenizer_config.json")
        data = cls._parse_tokenizer_json(text, source=str(path))
        if config.is_file():
            eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
            eos_text = eos.get("content") if isinstance(eos, dict) else eos
            if isinstance(eos_text, str):
                eos_ids = [
                    a["id"] for a in data.get("added_tokens", []) if a["content"] == eos_text
                ]
        return cls._from_tokenizer_data(
            data, logits_width=logits_width, stop_token_ids=[*eos_ids, *stop_token_ids]
        )

    @classmethod
    def from_transformers(
        cls,
        tokenizer: Any,
        logits_width: int | None = None,
        *,
        stop_token_ids: Iterable[int] = (),
    ) -> Vocabulary:
        """Build from a transformers fast tokenizer; its EOS plus `stop_token_ids` stop."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise VocabularyError(
                f"{type(tokenizer).__name__} is not a fast tokenizer; load it with use_fast=True"
            )
        data = cls._parse_tokenizer_json(backend.to_str(), source=type(tokenizer).__name__)
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        return cls._from_tokenizer_data(
            data,
            logits_width=logits_width,
            stop_token_ids=[*eos, *stop_token_ids],
            extra_special_ids=getattr(tokenizer, "all_special_ids", ()),
        )

    @classmethod
    def from_tiktoken(
        cls,
        path: str | Path,
        special_tokens: Mapping[str, int],
        logits_width: int | None = None,
        *,
        stop_token_ids: Iterable[int] | None = None,
    ) -> Vocabulary:
        """Load a .tiktoken rank file; specials are given by the caller, as tiktoken needs.

        Without `stop_token_ids`, the special named `<|endoftext|>` is the stop token when
        present; otherwise the caller must name one.
        """
        path = Path(path)
        ranks: dict[int, bytes] = {}
        try:
            lines = path.read_bytes().splitlines()
        except OSError as exc:
            raise VocabularyError(f"cannot read tiktoken file {path}: {exc}") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                token_b64, rank = line.split()
                ranks[int(rank)] = base64.b64decode(token_b64, validate=True)
            except ValueError:
                raise VocabularyError(
                    f"{path}:{number}: expected '<base64 token> <rank>'"
                ) from None
        names: dict[int, str] = {}
        for name, token_id in special_tokens.items():
            if token_id in ranks:
                raise VocabularyError(
                    f"special token {name!r} reuses id {token_id} of an ordinary token"
                )
            names[int(token_id)] = name
        n_tokens = max([*ranks, *names]) + 1
        table: list[bytes | None] = [ranks.get(i) for i in range(n_tokens)]
        if stop_token_ids is None:
            stop_token_ids = (
                [special_tokens["<|endoftext|>"]] if "<|endoftext|>" in special_tokens else []
            )
        return cls(
            table,
            special_token_ids=names,
            stop_token_ids=stop_token_ids,
            logits_width=logits_width,
            token_names=names,
        )

    @staticmethod
    def _parse_tokenizer_json(text: str, source: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise VocabularyError(f"{source} is not JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise VocabularyError(f"{source} has no 'model' section: not a tokenizer.json")
        return data

    @classmethod
    def _from_tokenizer_data(
        cls,
        data: dict[str, Any],
        *,
        logits_width: int | None,
        stop_token_ids: Iterable[int],
        extra_special_ids: Iterable[int] = (),
    ) -> Vocabulary:
        model = data["model"]
        vocab = model.get("vocab")
        if not isinstance(vocab, dict):
            raise VocabularyError(
                f"tokenizer model type {model.get('type')!r} has no token->id vocab"
            )
        decoders = _decoder_types(data.get("decoder"))
        if "ByteLevel" in decoders:
            decode = _decode_byte_level
        elif "ByteFallback" in decoders or "Metaspace" in decoders or "Replace" in decoders:
            decode = _decode_metaspace
        else:
            raise VocabularyError(
                f"unsupported tokenizer decoder {sorted(decoders) or None}: "
                "expected ByteLevel or Metaspace/ByteFallback"
            )
        added = data.get("added_tokens", [])
        ids = [*vocab.values(), *(a["id"] for a in added)]
        bad = [i for i in ids if not isinstance(i, int) or i < 0]
        if bad:
            raise VocabularyError(f"token id {bad[0]!r} is not a non-negative integer")
        first_piece: dict[int, str] = {}
        for piece, token_id in vocab.items():
            if first_piece.setdefault(token_id, piece) != piece:
                raise VocabularyError(
                    f"token id {token_id} is given to both {first_piece[token_id]!r} and {piece!r}"
                )
        table: list[bytes | None] = [None] * (max(ids) + 1)
        added_ids = {a["id"] for a in added}
        for piece, token_id in vocab.items():
            if token_id not in added_ids:
                table[token_id] = decode(piece)
        specials = set(extra_special_ids)
        names: dict[int, str] = {}
        for token in added:
            names[token["id"]] = token["content"]
            if token.get("special", False):
                specials.add(token["id"])
            else:
                table[token["id"]] = token["content"].encode("utf-8")
        return cls(
            table,
            special_token_ids=specials,
            stop_token_ids=stop_token_ids,
            logits_width=logits_width,
            token_names=names,
        )

    # ------------------------------------------------------------------ queries
    @property
    def num_tokens(self) -> int:
        """Ids with an entry in the tokenizer table (the rest of `size` is padding)."""
        return len(self._bytes)

    @property
    def token_bytes(self) -> tuple[bytes, ...]:
        """Exact bytes of each id; b'' for special, stop and unused ids."""
        return self._bytes

    def token_name(self, token_id: int) -> str:
        """Readable form of a token, for messages."""
        if token_id in self._names:
            return self._names[token_id]
        if 0 <= token_id < len(self._bytes):
            return self._bytes[token_id].decode("utf-8", "backslashreplace")
        return f"<id {token_id}>"

    def decode(self, token_ids: Iterable[int]) -> bytes:
        """Concatenated bytes of ordinary tokens (specials contribute nothing)."""
        table = self._bytes
        return b"".join(table[t] for t in token_ids if 0 <= t < len(table))

    @cached_property
    def fingerprint(self) -> str:
        """Stable identity for caches: same bytes, stops and width -> same key."""
        digest = hashlib.sha256()
        digest.update(
            f"{self.size}:{self.stop_token_ids}:{sorted(self.special_token_ids)}".encode()
        )
        for token in self._bytes:
            digest.update(len(token).to_bytes(4, "little"))
            digest.update(token)
        return digest.hexdigest()[:16]

    def __repr__(self) -> str:
        return (
            f"Vocabulary(tokens={self.num_tokens}, size={self.size}, "
            f"stop_token_ids={self.stop_token_ids}, specials={len(self.special_token_ids)})"
        )

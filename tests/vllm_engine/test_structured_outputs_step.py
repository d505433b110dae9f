"""The structured-output backend's batched step against vLLM's own per-token loop, on vLLM's
real `StructuredOutputManager` and `Request`s: the same bitmask rows from one pool fill as
from vLLM's fill, accept and rollback per request and draft, and `validate_tokens`,
`accept_tokens` and `rollback` exact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grammarmask as gm
from grammarmask.integrations.vllm.structured_outputs import register

SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
]
INSTANCES = [{"name": "Ada", "age": 36}, ["green", "red"]]
DRAFTS = 3


@pytest.fixture(scope="module")
def manager(model_dir: Path) -> Any:
    register()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.structured_output import StructuredOutputManager

    config = EngineArgs(
        model=str(model_dir),
        max_model_len=1024,
        max_num_seqs=4,
        enforce_eager=True,
        structured_outputs_config={"backend": "grammarmask"},
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": DRAFTS,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        },
    ).create_engine_config()
    built = StructuredOutputManager(config)
    yield built
    built.clear_backend()


def make_request(manager: Any, index: int, schema: dict[str, Any]) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=64, structured_outputs=StructuredOutputsParams(json=schema))
    params.structured_outputs._backend = "grammarmask"
    request = Request(f"r{index}", [1, 2, 3], params, None)
    manager.grammar_init(request)
    request.structured_output_request._grammar.result(timeout=60)  # the compile
    return request


@pytest.fixture(scope="module")
def answers(smollm2_tokenizer: Any) -> list[list[int]]:
    return [
        smollm2_tokenizer.encode(json.dumps(instance, separators=(",", ":")))
        for instance in INSTANCES
    ]


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_one_pool_fill_gives_vllms_rows_and_leaves_the_state_as_it_was(
    manager: Any, answers: list[list[int]], smollm2: gm.Vocabulary, data: st.DataObject
) -> None:
    requests, spec_tokens, forbidden_at = {}, {}, {}
    for index, (schema, answer) in enumerate(zip(SCHEMAS, answers, strict=True)):
        request = make_request(manager, index, schema)
        committed = data.draw(st.integers(0, len(answer) - DRAFTS - 1), label=f"committed {index}")
        assert manager.accept_tokens(request, answer[:committed])
        drafts = answer[committed : committed + DRAFTS]
        bad = data.draw(st.none() | st.integers(0, DRAFTS - 1), label=f"forbidden draft {index}")
        if bad is not None:  # a token no JSON text may hold here: the stop token at once
            drafts = [*drafts[:bad], smollm2.stop_token_ids[0], *drafts[bad + 1 :]]
        pad = data.draw(st.integers(0, DRAFTS - 1), label=f"padding {index}")
        drafts = drafts[: DRAFTS - pad] + [-1] * pad
        requests[request.request_id] = request
        spec_tokens[request.request_id] = drafts
        forbidden_at[request.request_id] = bad
    ids = list(requests)
    ours = manager.grammar_bitmask(requests, ids, spec_tokens)
    theirs = type(manager).grammar_bitmask.__wrapped__(manager, requests, ids, spec_tokens)
    again = manager.grammar_bitmask(requests, ids, spec_tokens)
    assert ours.shape == theirs.shape == (len(ids) * (DRAFTS + 1), (smollm2.size + 31) // 32)
    np.testing.assert_array_equal(again, ours)  # vLLM's loop rolled everything back
    row = 0
    for request_id in ids:
        drafts = spec_tokens[request_id]
        real = [token for token in drafts if token != -1]
        bad = forbidden_at[request_id]
        # rows vLLM uses: up to the first forbidden draft, or the first padded position
        used = (bad if bad is not None and bad < len(real) else len(real)) + 1
        np.testing.assert_array_equal(ours[row : row + used], theirs[row : row + used])
        grammar = requests[request_id].structured_output_request.grammar
        valid = grammar.validate_tokens(real)
        assert valid == real[: used - 1]
        row += len(drafts) + 1


def test_a_refused_token_leaves_the_grammar_usable_and_rollback_is_exact(
    manager: Any, answers: list[list[int]], smollm2: gm.Vocabulary
) -> None:
    request = make_request(manager, 9, SCHEMAS[0])
    answer = answers[0]
    grammar = request.structured_output_request.grammar
    ids = [request.request_id]
    assert grammar.accept_tokens(request.request_id, answer[:3])
    before = manager.grammar_bitmask({ids[0]: request}, ids, {})
    assert not grammar.accept_tokens(request.request_id, [smollm2.stop_token_ids[0]])
    np.testing.assert_array_equal(manager.grammar_bitmask({ids[0]: request}, ids, {}), before)
    assert grammar.accept_tokens(request.request_id, answer[3:6])
    grammar.rollback(3)
    np.testing.assert_array_equal(manager.grammar_bitmask({ids[0]: request}, ids, {}), before)
    assert grammar.accept_tokens(request.request_id, answer[3:])
    assert grammar.accept_tokens(request.request_id, [smollm2.stop_token_ids[0]])
    assert grammar.is_terminated()


def test_engines_that_choose_another_backend_get_vllms_own_validation(model_dir: Path) -> None:
    register()
    from vllm import SamplingParams
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tokenizers import cached_tokenizer_from_config

    config = EngineArgs(model=str(model_dir), max_model_len=1024).create_engine_config()
    tokenizer = cached_tokenizer_from_config(config.model_config)
    for backend, chosen in (("xgrammar", "xgrammar"), ("auto", "xgrammar"), ("grammarmask", None)):
        params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[a-z]+"))
        params._validate_structured_outputs(
            config.model_config, StructuredOutputsConfig(backend=backend), tokenizer
        )
        assert params.structured_outputs._backend == (chosen or "grammarmask")


def test_an_untested_vllm_refuses_the_backend_by_name_and_nothing_else() -> None:
    from vllm.config.utils import config

    from grammarmask.integrations.vllm.structured_outputs._hooks import _accept_backend_name

    @config
    class Settings:
        backend: Literal["auto", "xgrammar"] = "auto"

    _accept_backend_name(Settings, "0.99.0")
    assert Settings(backend="xgrammar").backend == "xgrammar"
    with pytest.raises(ValueError, match=r"tested with vLLM 0\.32\.x; this is vLLM 0\.99\.0"):
        Settings(backend="grammarmask")
    with pytest.raises(ValueError):
        Settings(backend="unknown")

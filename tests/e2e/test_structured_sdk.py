"""Structured outputs and tool calling through the official OpenAI SDK, on a real gateway process
over each engine kind (tests/e2e/conftest.py): JSON Schemas, json_object, tool_choice required
and named (streamed calls assembled from deltas), a full tool round trip, `auto` reading a call
the model wrote, and bad constraints refused before anything is billed."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from gateway_process import GatewayProcess, TenantInfo
from openai import AsyncOpenAI, OpenAI

from gateway.demo.adapters import demo_adapter_files
from tenancy.adapters.base_model import base_model_spec
from tests.structured_cases import MAX_TOKENS, SCHEMAS

MODEL = "tiny"
ADAPTERS = ("sql", "poet")
ASK = [{"role": "user", "content": "Answer as asked."}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
PARAMETERS = {"get_weather": WEATHER, "get_time": TIME}


@pytest.fixture(scope="module")
def owner(gateway_proc: GatewayProcess, tiny_model_dir: Path) -> TenantInfo:
    """A tenant with two LoRA adapters of its own."""
    tenant = gateway_proc.tenant()
    base = base_model_spec(tiny_model_dir, MODEL)
    for seed, name in enumerate(ADAPTERS, start=31):
        files = [(f.filename, f.data) for f in demo_adapter_files(base, seed=seed)]
        gateway_proc.upload_adapter(tenant.tenant_id, name, files)
    return tenant


def sdk(gateway: GatewayProcess, key: str) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=key, timeout=120, max_retries=0)


async def _answer(client: AsyncOpenAI, stream: bool, **kw: Any) -> tuple[str, str | None]:
    """(content, finish_reason), streamed deltas joined or the whole message."""
    if not stream:
        reply = await client.chat.completions.create(**kw)
        return reply.choices[0].message.content or "", reply.choices[0].finish_reason
    text, finish = [], None
    async for chunk in await client.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(text), finish


async def test_every_schema_answer_validates_streamed_and_not_on_base_and_adapters(
    gateway_proc: GatewayProcess, owner: TenantInfo
) -> None:
    """All requests at once, so base and adapter rows share the engine's batches."""
    client = AsyncOpenAI(base_url=gateway_proc.base_url, api_key=owner.key, timeout=300)
    models = (MODEL, *ADAPTERS)
    jobs = []
    for i, (name, schema) in enumerate(SCHEMAS.items()):
        for stream in (False, True):
            fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
            jobs.append(
                (
                    name,
                    _answer(
                        client,
                        stream,
                        model=models[i % 3],
                        messages=ASK,
                        response_format=fmt,
                        max_tokens=MAX_TOKENS,
                        temperature=(0.0, 1.0)[i % 2],
                        seed=i,
                    ),
                )
            )
    answers = await asyncio.gather(*(job for _, job in jobs))
    await client.close()
    for (name, _), (text, finish) in zip(jobs, answers, strict=True):
        assert finish == "stop", (name, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])


@pytest.fixture(scope="module")
def object_prefix(tiny_model_dir: Path) -> Any:
    """is_prefix(text): whether `text` is a JSON object or the start of one (llguidance on the
    tiny model's tokenizer; the grammar reads bytes, so any tokenization of the text does)."""
    import llguidance.hf
    from transformers import AutoTokenizer

    hf: Any = AutoTokenizer.from_pretrained(tiny_model_dir)
    vocab = json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=vocab)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        {"type": "object"}, defaults={"whitespace_flexible": False}
    )

    def is_prefix(text: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        ids = hf.encode(text, add_special_tokens=False, split_special_tokens=True)
        return bool(matcher.consume_tokens(ids)) and not matcher.is_error()

    return is_prefix


async def test_json_object_answers_are_objects(
    gateway_proc: GatewayProcess, owner: TenantInfo, object_prefix: Any
) -> None:
    """Any object: on a random-weight model an answer may outrun max_tokens (its strings and
    numbers are unbounded; on vLLM's sampler most do); then it is an object cut short, with
    finish_reason length: still the start of an object, never anything else."""
    client = AsyncOpenAI(base_url=gateway_proc.base_url, api_key=owner.key, timeout=300)
    answers = await asyncio.gather(
        *(
            _answer(
                client,
                seed % 2 == 1,
                model=MODEL,
                messages=ASK,
                response_format={"type": "json_object"},
                max_tokens=256,
                temperature=1.0,
                seed=seed,
            )
            for seed in range(8)
        )
    )
    await client.close()
    for text, finish in answers:
        if finish == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert finish == "length" and object_prefix(text), text


def _check_calls(calls: list[dict[str, str]], allowed: set[str]) -> None:
    assert calls
    for call in calls:
        assert call["name"] in allowed
        jsonschema.validate(json.loads(call["arguments"]), PARAMETERS[call["name"]])


def _whole_calls(reply: Any) -> list[dict[str, str]]:
    assert reply.choices[0].finish_reason == "tool_calls"
    calls = reply.choices[0].message.tool_calls or []
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    return [{"name": c.function.name, "arguments": c.function.arguments} for c in calls]


def _assemble(chunks: list[Any]) -> list[dict[str, str]]:
    """Tool calls assembled from stream deltas by index, as the SDK's stream helpers do."""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                if delta.function and delta.function.name:
                    call["name"] += delta.function.name
                if delta.function and delta.function.arguments:
                    call["arguments"] += delta.function.arguments
    assert finish == "tool_calls"
    return [calls[i] for i in sorted(calls)]


def _streamed_calls(stream: Any) -> list[dict[str, str]]:
    return _assemble(list(stream))


async def _both(client: AsyncOpenAI, **kw: Any) -> tuple[list[dict[str, str]], ...]:
    whole = _whole_calls(await client.chat.completions.create(**kw))
    streamed = _assemble([chunk async for chunk in await client.chat.completions.create(
        **kw, stream=True
    )])  # fmt: skip
    return whole, streamed


@pytest.mark.parametrize(
    ("tool_choice", "allowed"),
    [
        ("required", {"get_weather", "get_time"}),
        ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
    ],
)
async def test_required_and_named_tool_choice_always_call_an_allowed_tool(
    gateway_proc: GatewayProcess, owner: TenantInfo, tool_choice: Any, allowed: set[str]
) -> None:
    """Greedy and sampled, base model and adapter, parallel calls or one: streamed and whole
    answers (the same seed, so the same tokens) are calls to allowed tools with valid
    arguments, and the deltas assemble to the whole answer's calls."""
    client = AsyncOpenAI(base_url=gateway_proc.base_url, api_key=owner.key, timeout=300)
    cases = [
        {
            "model": (MODEL, ADAPTERS[0])[seed % 2],
            "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
            "tools": TOOLS,
            "tool_choice": tool_choice,
            "max_tokens": MAX_TOKENS,
            "temperature": (0.0, 1.0)[seed // 2],
            "seed": seed,
            "parallel_tool_calls": seed in (1, 2),
        }
        for seed in range(4)
    ]
    results = await asyncio.gather(*(_both(client, **kw) for kw in cases))
    await client.close()
    for kw, (whole, streamed) in zip(cases, results, strict=True):
        _check_calls(whole, allowed)
        _check_calls(streamed, allowed)
        assert streamed == whole
        if not kw["parallel_tool_calls"]:
            assert len(whole) == 1


def test_a_tool_round_trip_is_accepted(gateway_proc: GatewayProcess, owner: TenantInfo) -> None:
    client = sdk(gateway_proc, owner.key)
    question = [{"role": "user", "content": "Weather in Oslo?"}]
    first = client.chat.completions.create(
        model=MODEL,
        messages=question,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=MAX_TOKENS,
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    conversation = [
        *question,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 11}'},
    ]
    reply = client.chat.completions.create(
        model=MODEL, messages=conversation, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert first.usage is not None and reply.usage is not None
    # the call and its result are in the prompt: it grew by both
    assert reply.usage.prompt_tokens > first.usage.prompt_tokens + 10


def test_auto_reads_a_call_the_model_writes(
    gateway_proc: GatewayProcess, owner: TenantInfo
) -> None:
    """The model is made to write the template's call format (a regex constraint beside
    tool_choice auto), so the parser, not the grammar, is what turns it into a tool call."""
    written = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Time?"}],
        "tools": TOOLS,
        "tool_choice": "auto",
        "max_tokens": 64,
        "extra_body": {"structured_outputs": {"regex": _literal(written)}},
    }
    client = sdk(gateway_proc, owner.key)
    reply = client.chat.completions.create(**kw)
    assert reply.choices[0].message.content is None
    assert _whole_calls(reply) == [{"name": "get_time", "arguments": '{"zone": "UTC"}'}]
    assert _streamed_calls(client.chat.completions.create(**kw, stream=True)) == _whole_calls(reply)


def _literal(text: str) -> str:
    """A regex matching `text` exactly."""
    return "".join(
        "\\" + c if c in "{}[]().*+?|^$\\" else ("\\n" if c == "\n" else c) for c in text
    )


def _num_requests(gateway: GatewayProcess, tenant_id: str) -> int:
    """Requests in the tenant's usage ledger (the report sums them per day and model)."""
    r = gateway.admin("GET", f"/tenants/{tenant_id}/usage")
    assert r.status_code == 200, r.text
    return sum(row["num_requests"] for row in r.json())


def _wait_requests(gateway: GatewayProcess, tenant_id: str, count: int) -> None:
    for _ in range(200):  # the usage writer flushes every 50 ms in these tests
        if _num_requests(gateway, tenant_id) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} requests in the usage ledger")


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strange"}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "uri-reference"}}}}, "response_format.json_schema.schema"),
    ({"extra_body": {"guided_regex": "(unclosed"}}, "guided_regex"),
    ({"extra_body": {"guided_grammar": "root ::= nowhere"}}, "guided_grammar"),
    ({"extra_body": {"structured_outputs": {"choice": []}}}, "structured_outputs.choice"),
    ({"extra_body": {"structured_outputs": {"regex": "a{2"}}}, "structured_outputs.regex"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "absent"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
]  # fmt: skip


def test_bad_constraints_are_400_naming_the_field_and_bill_nothing(
    gateway_proc: GatewayProcess,
) -> None:
    tenant = gateway_proc.tenant()
    client = sdk(gateway_proc, tenant.key)
    plain = {"model": MODEL, "messages": ASK, "max_tokens": 2}
    client.chat.completions.create(**plain)
    _wait_requests(gateway_proc, tenant.tenant_id, 1)
    for fields, param in BAD:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**{**plain, **fields})
        assert caught.value.param == param, (fields, caught.value.message)
    client.chat.completions.create(**plain)
    _wait_requests(gateway_proc, tenant.tenant_id, 2)
    # the usage writer keeps order: the second good request's row is the next one written
    assert _num_requests(gateway_proc, tenant.tenant_id) == 2

"""The Responses API (`POST /v1/responses`) through the official OpenAI SDK, on a real gateway
process over each engine kind (tests/e2e/conftest.py): text, `text.format` JSON Schemas and
required function tools, each streamed (the SDK's `responses.stream` helper, and the events
assembled by hand) and whole with equal answers; a tool round trip; an answer cut by
`max_output_tokens`; usage in the ledger; and what the stateless server refuses, by field."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from gateway_process import GatewayProcess, TenantInfo
from openai import OpenAI
from openai.types.responses import Response

from tests.structured_cases import MAX_TOKENS, SCHEMAS

MODEL = "tiny"
ASK = "Answer as asked."
PERSON = SCHEMAS["flat"]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True},
    {"type": "function", "name": "find_person", "description": "Look someone up.",
     "parameters": PERSON, "strict": True},
]  # fmt: skip
PARAMETERS = {tool["name"]: tool["parameters"] for tool in TOOLS}


def sdk(gateway: GatewayProcess, key: str) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=key, timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def tenant(gateway_proc: GatewayProcess) -> TenantInfo:
    return gateway_proc.tenant()


def _without_ids(value: Any) -> Any:
    """An answer as data, without what differs between two requests for the same tokens."""
    if isinstance(value, dict):
        # and what the SDK's stream helper adds (its parse of the text and the arguments)
        skip = {"id", "call_id", "created_at", "cached_tokens", "parsed", "parsed_arguments"}
        return {k: _without_ids(v) for k, v in value.items() if k not in skip}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


def _both(client: OpenAI, *, helper: bool = True, **kw: Any) -> tuple[Response, Response]:
    """The whole answer, and the streamed one (through the SDK's `responses.stream` helper, which
    needs the answer completed, or the raw events); checks the stream's events on the way:
    order, sequence numbers, and the deltas assembling into the final answer's items."""
    whole = client.responses.create(**kw)
    events: list[Any]
    if helper:
        with client.responses.stream(**kw) as stream:
            events = list(stream)
            final: Response = stream.get_final_response()
    else:
        events = list(client.responses.create(**kw, stream=True))
        final = events[-1].response
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{final.status}" and final.status != "failed"
    texts: dict[str, str] = {}
    arguments: dict[str, str] = {}
    for e in events:
        if e.type == "response.output_text.delta":
            texts[e.item_id] = texts.get(e.item_id, "") + e.delta
        elif e.type == "response.function_call_arguments.delta":
            arguments[e.item_id] = arguments.get(e.item_id, "") + e.delta
    for item in final.output:
        if item.type == "message":
            assert texts.get(item.id, "") == item.content[0].text  # type: ignore[union-attr]
        elif item.type == "function_call":
            assert item.id is not None and arguments[item.id] == item.arguments
    assert _without_ids(final.model_dump()) == _without_ids(whole.model_dump())
    return whole, final


def test_text_streamed_and_whole(gateway_proc: GatewayProcess, tenant: TenantInfo) -> None:
    whole, _ = _both(
        sdk(gateway_proc, tenant.key),
        helper=False,  # a random-weight model may well not stop by itself: incomplete
        model=MODEL,
        input="Tell me about the sea.",
        instructions="Be brief.",
        max_output_tokens=16,
        temperature=0,
        metadata={"run": "e2e"},
    )
    assert whole.object == "response" and whole.id.startswith("resp_") and whole.model == MODEL
    assert whole.status in ("completed", "incomplete") and whole.error is None
    assert whole.store is False and whole.metadata == {"run": "e2e"}
    assert whole.instructions == "Be brief." and whole.max_output_tokens == 16
    assert [item.type for item in whole.output] == ["message"]
    assert whole.output_text == whole.output[0].content[0].text  # type: ignore[union-attr]
    usage = whole.usage
    assert usage is not None and 0 < usage.output_tokens <= 16
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


@pytest.mark.parametrize("name", ["nested", "array_of_objects", "number_range"])
def test_json_schema_format_streamed_and_whole(
    gateway_proc: GatewayProcess, tenant: TenantInfo, name: str
) -> None:
    schema = SCHEMAS[name]
    fmt = {"type": "json_schema", "name": name, "schema": schema, "strict": True}
    whole, _ = _both(
        sdk(gateway_proc, tenant.key),
        model=MODEL,
        input=ASK,
        text={"format": fmt},  # type: ignore[typeddict-item]
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert whole.status == "completed"
    jsonschema.validate(json.loads(whole.output_text), schema)
    assert whole.text is not None and whole.text.format is not None
    assert whole.text.format.type == "json_schema"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "find_person"}])
def test_required_tool_calls_streamed_and_whole(
    gateway_proc: GatewayProcess, tenant: TenantInfo, choice: Any
) -> None:
    whole, _ = _both(
        sdk(gateway_proc, tenant.key),
        model=MODEL,
        input=ASK,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert whole.status == "completed" and whole.parallel_tool_calls is False
    calls = [item for item in whole.output if item.type == "function_call"]
    assert len(calls) == 1 and len(whole.output) == 1
    call = calls[0]
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert call.name in PARAMETERS if choice == "required" else call.name == "find_person"
    jsonschema.validate(json.loads(call.arguments), PARAMETERS[call.name])


def test_a_tool_round_trip(gateway_proc: GatewayProcess, tenant: TenantInfo) -> None:
    client = sdk(gateway_proc, tenant.key)
    first = client.responses.create(
        model=MODEL, input=ASK, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=MAX_TOKENS, temperature=0,
    )  # fmt: skip
    call = first.output[0]
    assert call.type == "function_call"
    history: list[Any] = [
        {"role": "user", "content": ASK},
        *(item.model_dump(exclude_none=True) for item in first.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"ok": true}'},
    ]
    second = client.responses.create(
        model=MODEL, input=history, tools=TOOLS, max_output_tokens=8, temperature=0
    )
    assert second.status in ("completed", "incomplete")
    # The call and its output are in the prompt: more input tokens than the question alone.
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens


def test_max_output_tokens_cuts_the_answer(
    gateway_proc: GatewayProcess, tenant: TenantInfo
) -> None:
    client = sdk(gateway_proc, tenant.key)
    kw: Any = {"model": MODEL, "input": "Go on and on.", "max_output_tokens": 3,
               "extra_body": {"ignore_eos": True}}  # fmt: skip
    whole = client.responses.create(**kw)
    assert whole.status == "incomplete"
    assert whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage is not None and whole.usage.output_tokens == 3
    events = list(client.responses.create(**kw, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.usage is not None
    assert events[-1].response.usage.output_tokens == 3


def test_usage_is_in_the_ledger(gateway_proc: GatewayProcess) -> None:
    owner = gateway_proc.tenant()
    client = sdk(gateway_proc, owner.key)
    whole = client.responses.create(model=MODEL, input="hi", max_output_tokens=4)
    events = list(
        client.responses.create(model=MODEL, input="hi", max_output_tokens=4, stream=True)
    )
    streamed = events[-1].response
    answers = [whole, streamed]
    tokens = sum(a.usage.output_tokens for a in answers if a.usage is not None)
    rows: list[dict[str, Any]] = []
    for _ in range(100):  # the usage writer flushes every 50 ms in these tests
        r = gateway_proc.admin("GET", f"/tenants/{owner.tenant_id}/usage")
        assert r.status_code == 200, r.text
        rows = r.json()
        if rows and rows[0]["num_requests"] == 2:
            break
        time.sleep(0.05)
    assert [(row["model"], row["num_requests"]) for row in rows] == [(MODEL, 2)]
    assert rows[0]["completion_tokens"] == tokens


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
         "input[0].content[1].type"),
        ({"input": [{"type": "input_image", "image_url": "https://example.com/a.png"}]},
         "input[0].type"),
        ({"text": {"format": {"type": "json_schema", "name": "x",
                              "schema": {"type": "string", "format": "uri-reference"}}}},
         "text.format.schema"),
        ({"max_output_tokens": 10**9}, "max_output_tokens"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(
    gateway_proc: GatewayProcess, tenant: TenantInfo, fields: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"model": MODEL, "input": "hi", **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(gateway_proc, tenant.key).responses.create(**body)
    assert caught.value.param == param
    if param in ("previous_response_id", "store"):
        assert "does not store responses" in caught.value.message


def test_the_stateless_refusal_is_not_billed(gateway_proc: GatewayProcess) -> None:
    owner = gateway_proc.tenant()
    r = httpx.post(
        gateway_proc.base_url + "/responses",
        headers={"authorization": f"Bearer {owner.key}"},
        json={"model": MODEL, "input": "hi", "previous_response_id": "resp_1"},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter"
    time.sleep(0.2)
    assert gateway_proc.admin("GET", f"/tenants/{owner.tenant_id}/usage").json() == []

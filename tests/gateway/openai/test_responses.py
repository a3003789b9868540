"""The Responses API: input items -> chat messages, Responses tools and text.format -> chat's,
the refusals, and the answer's rendering (the whole Response and its typed events, checked
against the OpenAI SDK's models) without a model; then a few requests to the in-process gateway
(the streamed events equal the whole answer, usage in the ledger, errors named as sent)."""

from __future__ import annotations

import json
import typing
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from gateway_harness import MODEL, Gateway
from openai.types.responses import Response, ResponseStreamEvent

from gateway.engines.api import EngineStreamError
from gateway.openai.responses import chat_messages, responses_tool_plan, text_constraint
from gateway.openai.responses_render import ResponseRenderer
from gateway.openai.tool_calls import CLOSE_TAG, OPEN_TAG
from gateway.text.choices import ChoiceDelta
from tenancy.errors import BadRequest

# The SDK's model of each event type (ResponseStreamEvent is an annotated union of them).
_EVENT_MODELS = {
    typing.get_args(model.model_fields["type"].annotation)[0]: model
    for model in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def _validate_event(event: dict[str, Any]) -> None:
    _EVENT_MODELS[event["type"]].model_validate(event)


def _param(call: Any, *args: Any) -> str | None:
    with pytest.raises(BadRequest) as caught:
        call(*args)
    return caught.value.param


# ---- input, tools, text.format -----------------------------------------------------------------


def test_input_items_become_chat_messages() -> None:
    assert chat_messages("hi", "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                         {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "two"}]},
        {"type": "function_call", "call_id": "call_3", "name": "f", "arguments": "{}"},
    ]  # fmt: skip
    assert chat_messages(items, None) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
            {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": {}}},
        ]},
        {"role": "tool", "content": "one", "tool_call_id": "call_1"},
        {"role": "tool", "content": "two", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_3", "type": "function", "function": {"name": "f", "arguments": {}}},
        ]},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([], "input"),
        ([{"type": "reasoning", "summary": []}], "input[0].type"),
        ([{"type": "input_image", "image_url": "x"}], "input[0].type"),
        ([{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
         "input[0].content[0].type"),
        ([{"role": "tool", "content": "x"}], "input[0].role"),
        ([{"role": "user", "content": 5}], "input[0].content"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}],
         "input[0].arguments"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
        ([{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}],
         "input[0].output[0].type"),
    ],
)  # fmt: skip
def test_unsupported_input_is_named(items: list[dict[str, Any]], param: str) -> None:
    assert _param(chat_messages, items, None) == param


def test_function_tools_in_the_responses_shape() -> None:
    tool = {"type": "function", "name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {}}, "strict": True}  # fmt: skip
    plan = responses_tool_plan([tool], {"type": "function", "name": "get_weather"}, False)
    assert plan is not None and plan.choice == "named" and not plan.parallel
    assert plan.tools == [{"type": "function", "function": {k: v for k, v in tool.items()
                                                            if k != "type"}}]  # fmt: skip
    assert plan.constraint(None) is not None  # a named call is forced by a grammar
    assert _param(responses_tool_plan, [{"type": "web_search"}], None, None) == "tools[0].type"
    assert _param(responses_tool_plan, [{"name": "f"}], None, None) == "tools[0].type"
    bad_name = [{"type": "function", "name": "no spaces"}]
    assert _param(responses_tool_plan, bad_name, None, None) == "tools[0].name"
    twice = [{"type": "function", "name": "f"}] * 2
    assert _param(responses_tool_plan, twice, None, None) == "tools[1].name"
    named = {"type": "function", "function": {"name": "f"}}  # chat's shape, not this API's
    assert _param(responses_tool_plan, [{"type": "function", "name": "f"}], named, None) == (
        "tool_choice"
    )


def test_text_format_is_chats_response_format() -> None:
    assert text_constraint(None) is None
    assert text_constraint({"format": {"type": "text"}}) is None
    json_object = text_constraint({"format": {"type": "json_object"}})
    assert json_object is not None and json_object.wire.json_object
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    constraint = text_constraint({"format": fmt})
    assert constraint is not None
    assert constraint.wire.json_ == schema and constraint.param == "text.format.schema"
    no_name = {"format": {"type": "json_schema", "schema": schema}}
    assert _param(text_constraint, no_name) == "text.format.name"
    assert _param(text_constraint, {"format": {"type": "yaml"}}) == "text.format.type"


# ---- rendering ---------------------------------------------------------------------------------


def _renderer(reads_calls: bool) -> ResponseRenderer:
    echo = {"parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "store": False}
    return ResponseRenderer(
        response_id="resp_1", model=MODEL, created_at=1, echo=echo, reads_calls=reads_calls
    )


def _deltas(chunks: list[str], reason: str) -> list[list[ChoiceDelta]]:
    out = [[ChoiceDelta(index=0, text=c, num_tokens=1)] for c in chunks]
    out.append([ChoiceDelta(index=0, text="", num_tokens=0, finish_reason=reason)])
    return out


def _sse(data: bytes) -> list[dict[str, Any]]:
    events = []
    for block in data.decode().split("\n\n")[:-1]:
        kind, payload = block.split("\n")
        event = json.loads(payload.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    return events


def _assembled(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items as a client builds them from the deltas alone."""
    items: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["type"] == "response.output_item.added":
            assert e["output_index"] == len(items)  # each new item takes the next index
            assert all(i["status"] != "in_progress" for i in items.values())  # one at a time
            items[e["output_index"]] = {**e["item"], "text": ""}
        elif e["type"] == "response.output_text.delta":
            items[e["output_index"]]["text"] += e["delta"]
        elif e["type"] == "response.function_call_arguments.delta":
            items[e["output_index"]]["arguments"] += e["delta"]
        elif e["type"] == "response.output_item.done":
            item = items[e["output_index"]]
            if item["type"] == "message":
                assert item["text"] == e["item"]["content"][0]["text"]
            else:
                assert item["arguments"] == e["item"]["arguments"]
            items[e["output_index"]] = e["item"]
    return [items[i] for i in range(len(items))]


def _run(chunks: list[str], reason: str, *, reads_calls: bool) -> tuple[Any, list[Any]]:
    output = SimpleNamespace(num_prompt_tokens=5, num_completion_tokens=len(chunks),
                             num_cached_tokens=2)  # fmt: skip
    whole = _renderer(reads_calls)
    for deltas in _deltas(chunks, reason):
        whole.add(deltas)
    body = whole.body(output)  # type: ignore[arg-type]
    streamed = _renderer(reads_calls)
    # As the run does it: the first event is rendered, then the head is sent before it.
    first, *rest = _deltas(chunks, reason)
    data = b"".join(streamed.stream_deltas(first))
    data = b"".join(streamed.stream_start(output)) + data  # type: ignore[arg-type]
    for deltas in rest:
        data += b"".join(streamed.stream_deltas(deltas))
    data += b"".join(streamed.stream_end(output))  # type: ignore[arg-type]
    events = _sse(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        _validate_event(event)  # every event parses as the SDK's model
    Response.model_validate(body)
    final = events[-1]["response"]
    assert _without_ids(_assembled(events)) == _without_ids(final["output"])
    assert _without_ids(final) == _without_ids(body)
    return body, events


def _without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k not in ("id", "call_id")}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


CALL = f'{OPEN_TAG}\n{{"name": "f", "arguments": {{"a": [1, "}}"]}}}}\n{CLOSE_TAG}'


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_text_and_calls_render_the_same_whole_and_streamed(size: int) -> None:
    text = "  Let me check.\n" + CALL + "\n" + CALL.replace('"f"', '"g"') + "\nDone. "
    chunks = [text[i : i + size] for i in range(0, len(text), size)]
    body, events = _run(chunks, "stop", reads_calls=True)
    assert body["status"] == "completed" and body["incomplete_details"] is None
    assert [(i["type"], i["status"]) for i in body["output"]] == [
        ("message", "completed"), ("function_call", "completed"),
        ("function_call", "completed"), ("message", "completed"),
    ]  # fmt: skip
    assert Response.model_validate(body).output_text == "Let me check.Done."
    calls = body["output"][1:3]
    arguments = {"a": [1, "}"]}
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("f", arguments),
                                                                        ("g", arguments)]  # fmt: skip
    assert all(c["id"].startswith("fc_") and c["call_id"].startswith("call_") for c in calls)
    assert body["usage"] == {
        "input_tokens": 5, "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
        "output_tokens": len(chunks), "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5 + len(chunks),
    }  # fmt: skip
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["output"] == [] and events[0]["response"]["usage"] is None
    assert kinds[-1] == "response.completed"


def test_a_cut_answer_is_incomplete_and_plain_text_keeps_its_whitespace() -> None:
    body, events = _run([" a", "b ", f" {OPEN_TAG}"], "length", reads_calls=False)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    assert Response.model_validate(body).output_text == f" ab  {OPEN_TAG}"
    assert events[-1]["type"] == "response.incomplete"


def test_an_empty_answer_is_one_empty_message() -> None:
    body, _ = _run([], "stop", reads_calls=True)
    assert [i["content"][0]["text"] for i in body["output"]] == [""]


# ---- through the gateway -----------------------------------------------------------------------


pytestmark_gateway = pytest.mark.asyncio(loop_scope="module")


def _body(**fields: Any) -> dict[str, Any]:
    # store false, reasoning and include (but logprobs) are accepted: nothing changes
    return {"model": MODEL, "input": "Tell me a story.", "temperature": 0, "store": False,
            "reasoning": {}, "include": ["reasoning.encrypted_content"],
            "max_output_tokens": 6, "ignore_eos": True, **fields}  # fmt: skip


@pytestmark_gateway
async def test_streamed_equals_whole_and_usage_is_recorded(gateway: Gateway) -> None:
    tenant = await gateway.tenant()
    r = await gateway.client.post("/v1/responses", headers=tenant.headers, json=_body())
    assert r.status_code == 200, r.text
    whole = Response.model_validate(r.json())
    assert whole.id.startswith("resp_") and whole.status == "incomplete"
    assert whole.usage is not None and whole.usage.output_tokens == 6
    async with gateway.client.stream(
        "POST", "/v1/responses", headers=tenant.headers, json=_body(stream=True)
    ) as streamed:
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = _sse(b"".join([chunk async for chunk in streamed.aiter_bytes()]))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    # The second request may read its prompt from the prefix cache: only that count differs.
    for answer in (final, r.json()):
        answer["usage"]["input_tokens_details"]["cached_tokens"] = 0
    assert _without_ids(final) == _without_ids(r.json()) | {"created_at": final["created_at"]}
    records = await gateway.usage_records(tenant)
    assert len(records) == 2 and {rec.completion_tokens for rec in records} == {6}
    assert {rec.request_id.replace("-", "_", 1) for rec in records} == {whole.id, final["id"]}


@pytestmark_gateway
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"), ({"store": True}, "store"),
        ({"conversation": "conv_1"}, "conversation"), ({"background": True}, "background"),
        ({"max_tokens": 5}, "max_tokens"), ({"response_format": {"type": "json_object"}},
                                            "response_format"),
        ({"n": 2}, "n"), ({"top_logprobs": 2}, "top_logprobs"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"), ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"role": "user", "content": "hi"}, {"type": "reasoning"}]}, "input[1].type"),
        ({"text": {"format": {"type": "json_schema", "name": "x",
                              "schema": {"type": "string", "format": "no-such"}}}},
         "text.format.schema"),
    ],
)  # fmt: skip
async def test_bad_requests_name_the_field(
    gateway: Gateway, fields: dict[str, Any], param: str
) -> None:
    tenant = await gateway.tenant()
    r = await gateway.client.post("/v1/responses", headers=tenant.headers, json=_body(**fields))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert await gateway.usage_records(tenant) == []


class _FailingStream:
    """A real engine stream that fails after its third event (a replica dying)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:  # abort, aclose
        return getattr(self.inner, name)

    async def __aiter__(self) -> AsyncIterator[Any]:
        num_events = 0
        async for event in self.inner:
            yield event
            num_events += 1
            if num_events == 3:
                raise EngineStreamError("the replica died")


@pytestmark_gateway
async def test_an_engine_failure_mid_stream_is_response_failed(gateway: Gateway) -> None:
    tenant = await gateway.tenant()
    lifecycle, engine = gateway.state.lifecycle, gateway.state.lifecycle.engine

    async def open_failing(request: Any, adapter: Any, traceparent: Any = None) -> _FailingStream:
        return _FailingStream(await engine.open(request, adapter, traceparent))

    lifecycle.engine = SimpleNamespace(open=open_failing)  # type: ignore[assignment]
    try:
        body = _body(stream=True, max_output_tokens=50)
        async with gateway.client.stream(
            "POST", "/v1/responses", headers=tenant.headers, json=body
        ) as streamed:
            assert streamed.status_code == 200
            events = _sse(b"".join([chunk async for chunk in streamed.aiter_bytes()]))
    finally:
        lifecycle.engine = engine
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    failed = events[-1]
    assert failed["type"] == "response.failed" and "response.completed" not in str(events)
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert [item["status"] for item in failed["response"]["output"]] == ["incomplete"]
    _validate_event(failed)
    (record,) = await gateway.usage_records(tenant)
    assert record.finish_reason == "error" and record.completion_tokens >= 1

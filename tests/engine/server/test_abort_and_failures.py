"""Aborts, client disconnects and engine failures: every exit path leaves the engine idle and
consistent. The stream tests run a real uvicorn on a free loopback port."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from engine.loop.async_engine import AsyncEngine
from engine.loop.llm_engine import LLMEngine
from tests.engine.loop.async_helpers import TIMEOUT_S, assert_idle_and_consistent
from tests.engine.server.server_helpers import (
    GENERATE,
    LONG,
    break_the_loop,
    gen_body,
    metric_samples,
    parse_sse,
    read_events,
    wait_until,
)


async def test_abort_requests_body_rules(client: httpx.AsyncClient):
    response = await client.post("/abort_requests", json={"request_ids": ["nope"]})
    assert response.status_code == 200 and response.content == b""
    for raw in (b"{}", b"not json", b'{"request_ids": "x"}'):
        response = await client.post("/abort_requests", content=raw)
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"


async def test_abort_of_a_running_stream(live_url: str, engine: AsyncEngine):
    body = gen_body(
        max_tokens=LONG, request_id="to-abort", stream=True, stream_options={"include_usage": True}
    )
    async with (
        httpx.AsyncClient(base_url=live_url, timeout=TIMEOUT_S) as http,
        http.stream("POST", GENERATE, json=body) as response,
    ):
        assert response.status_code == 200
        events = read_events(response)
        first = await anext(events)
        assert first["choices"][0]["token_ids"]
        aborted = await http.post("/abort_requests", json={"request_ids": ["to-abort"]})
        assert aborted.status_code == 200
        rest = [event async for event in events]
    assert rest[-1] == "[DONE]"
    usage = rest[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] < LONG
    finishes = [c["finish_reason"] for e in (first, *rest[:-2]) for c in e["choices"]]
    assert finishes[-1] == "abort" and set(finishes[:-1]) == {None}
    await assert_idle_and_consistent(engine)


async def test_stream_client_disconnect_aborts(live_url: str, engine: AsyncEngine):
    before = engine.stats().generation_tokens_total
    async with httpx.AsyncClient(base_url=live_url, timeout=TIMEOUT_S) as http:
        async with http.stream("POST", GENERATE, json=gen_body(LONG, stream=True)) as response:
            first = await anext(read_events(response))
            assert first["choices"][0]["token_ids"]
        # leaving the block closes the connection mid-stream
        await assert_idle_and_consistent(engine)
        assert engine.stats().generation_tokens_total - before < LONG
        metrics = metric_samples((await http.get("/metrics")).text)
    aborted = [
        s.value
        for s in metrics["vllm:request_success_total"]
        if s.labels["finished_reason"] == "abort"
    ]
    assert aborted == [1.0]


async def test_non_streaming_client_disconnect_aborts(live_url: str, engine: AsyncEngine):
    before = engine.stats().generation_tokens_total
    async with httpx.AsyncClient(base_url=live_url, timeout=TIMEOUT_S) as http:
        request = asyncio.create_task(http.post(GENERATE, json=gen_body(LONG)))
        await wait_until(lambda: engine.stats().num_running == 1)
        request.cancel()  # closes the connection
        with pytest.raises(asyncio.CancelledError):
            await request
        await assert_idle_and_consistent(engine)
    assert engine.stats().generation_tokens_total - before < LONG


# ---- engine failures ----------------------------------------------------------------------------


async def test_engine_failure_is_500_then_health_503(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    llm_engine: LLMEngine,
    monkeypatch: pytest.MonkeyPatch,
):
    assert (await client.get("/health")).status_code == 200
    break_the_loop(llm_engine, monkeypatch)
    response = await client.post(GENERATE, json=gen_body(request_id="doomed"))
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["code"] == 500
    assert "injected" not in error["message"]
    health = await client.get("/health")
    assert health.status_code == 503 and health.json() == {"status": "dead"}
    response = await client.post(GENERATE, json=gen_body())
    assert response.status_code == 503
    await engine.shutdown()
    monkeypatch.undo()
    llm_engine.abort_requests(["doomed"])


async def test_engine_failure_mid_stream_is_an_error_event(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    llm_engine: LLMEngine,
    monkeypatch: pytest.MonkeyPatch,
):
    break_the_loop(llm_engine, monkeypatch)
    response = await client.post(GENERATE, json=gen_body(request_id="doomed-stream", stream=True))
    assert response.status_code == 200
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]"
    assert events[-2] == {
        "error": {
            "message": events[-2]["error"]["message"],
            "type": "server_error",
            "param": None,
            "code": 500,
        }
    }
    await engine.shutdown()
    monkeypatch.undo()
    llm_engine.abort_requests(["doomed-stream"])

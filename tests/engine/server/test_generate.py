"""POST /inference/v1/generate on the real engine (spec/tokens-api.md): bodies, streams, choices,
logprobs, seeds, the prefix cache's salt, model names. Through httpx's ASGI transport."""

from __future__ import annotations

import httpx
import pytest

from engine.loop.async_engine import AsyncEngine
from tests.engine.loop.async_helpers import assert_idle_and_consistent
from tests.engine.server.server_helpers import (
    GENERATE,
    engine_untouched,
    gen_body,
    parse_sse,
)


async def test_non_streaming_body(client: httpx.AsyncClient, engine: AsyncEngine):
    response = await client.post(GENERATE, json=gen_body(max_tokens=6, request_id="r-1"))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"request_id", "choices", "prompt_logprobs", "kv_transfer_params", "usage"}
    assert body["request_id"] == "r-1"
    [choice] = body["choices"]
    assert set(choice) == {"index", "token_ids", "finish_reason", "stop_reason", "logprobs"}
    assert choice["index"] == 0 and len(choice["token_ids"]) == 6
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert choice["logprobs"] is None and body["prompt_logprobs"] is None
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "cached_tokens": 0}
    assert all(0 <= t < engine.vocab_size for t in choice["token_ids"])
    await assert_idle_and_consistent(engine)


async def test_request_id_defaults_to_a_fresh_uuid(client: httpx.AsyncClient):
    first = (await client.post(GENERATE, json=gen_body(max_tokens=1))).json()["request_id"]
    second = (await client.post(GENERATE, json=gen_body(max_tokens=1))).json()["request_id"]
    assert len(first) == 36 and first != second


async def test_streaming_events(client: httpx.AsyncClient, engine: AsyncEngine):
    plain = (await client.post(GENERATE, json=gen_body(max_tokens=6))).json()
    response = await client.post(
        GENERATE,
        json=gen_body(
            max_tokens=6,
            request_id="s-1",
            stream=True,
            stream_options={"include_usage": True},
            kv_transfer_params={"remote": {"block_ids": [1, 2]}},
        ),
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert all(chunk["request_id"] == "s-1" for chunk in (*chunks, usage))
    assert chunks[0]["kv_transfer_params"] == {"remote": {"block_ids": [1, 2]}}
    streamed = [t for chunk in chunks for c in chunk["choices"] for t in c["token_ids"]]
    assert streamed == plain["choices"][0]["token_ids"]  # greedy: the same tokens, each once
    finish = [c["finish_reason"] for chunk in chunks for c in chunk["choices"]]
    assert finish[-1] == "length" and set(finish[:-1]) == {None}
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "cached_tokens": 0}
    await assert_idle_and_consistent(engine)


async def test_streaming_without_usage_has_no_usage_event(client: httpx.AsyncClient):
    response = await client.post(GENERATE, json=gen_body(max_tokens=3, stream=True))
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]"
    assert all(event["choices"] and event["usage"] is None for event in events[:-1])


async def test_n_choices_and_logprobs_shape(client: httpx.AsyncClient):
    body = gen_body(
        max_tokens=4,
        sampling_params={
            "n": 2,
            "temperature": 1.0,
            "seed": 3,
            "logprobs": 2,
            "prompt_logprobs": 1,
        },
    )
    payload = (await client.post(GENERATE, json=body)).json()
    assert [c["index"] for c in payload["choices"]] == [0, 1]
    for choice in payload["choices"]:
        content = choice["logprobs"]["content"]
        assert len(content) == len(choice["token_ids"]) == 4
        for token_id, entry in zip(choice["token_ids"], content, strict=True):
            assert entry["token"] == f"token_id:{token_id}"
            assert entry["bytes"] is None and entry["logprob"] <= 0
            assert len(entry["top_logprobs"]) == 2
            assert all(top["token"].startswith("token_id:") for top in entry["top_logprobs"])
    prompt = payload["prompt_logprobs"]
    assert len(prompt) == 5 and prompt[0] is None
    for position, token_id in enumerate([2, 3, 4, 5], start=1):
        entry = prompt[position]
        assert str(token_id) in entry  # the prompt token itself, plus the top 1
        assert all(set(v) == {"logprob", "rank"} for v in entry.values())


async def test_same_seed_gives_the_same_tokens(client: httpx.AsyncClient):
    body = gen_body(max_tokens=8, sampling_params={"temperature": 1.0, "seed": 42})
    first = (await client.post(GENERATE, json=body)).json()["choices"][0]["token_ids"]
    second = (await client.post(GENERATE, json=body)).json()["choices"][0]["token_ids"]
    assert first == second


async def test_max_tokens_past_the_context_is_capped(
    client: httpx.AsyncClient, engine: AsyncEngine
):
    prompt = [7] * (engine.max_model_len - 3)
    body = gen_body(token_ids=prompt, sampling_params={"max_tokens": 10**9})
    payload = (await client.post(GENERATE, json=body)).json()
    assert len(payload["choices"][0]["token_ids"]) == 3
    assert payload["choices"][0]["finish_reason"] == "length"


async def test_usage_counts_prefix_cache_hits(client: httpx.AsyncClient, engine: AsyncEngine):
    block = engine.config.block_size
    body = gen_body(max_tokens=1, token_ids=list(range(1, 3 * block + 2)), cache_salt="s")
    first = (await client.post(GENERATE, json=body)).json()["usage"]
    second = (await client.post(GENERATE, json=body)).json()["usage"]
    other_salt = (await client.post(GENERATE, json={**body, "cache_salt": "t"})).json()["usage"]
    assert first["cached_tokens"] == 0 and other_salt["cached_tokens"] == 0
    assert second["cached_tokens"] == 3 * block
    assert second["prompt_tokens"] == 3 * block + 1


async def test_logs_never_hold_salts_or_tenant_keys(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
):
    caplog.set_level("DEBUG")
    salt, tenant = "SALT-5f1e2d", "TENANT-9a8b7c"
    await client.post(GENERATE, json=gen_body(cache_salt=salt, fairness_key=tenant))
    await client.post(GENERATE, json=gen_body(cache_salt=salt, token_ids=[-1]))
    await client.post(GENERATE, json=gen_body(cache_salt=salt, stream=True, max_tokens=2))
    metrics = (await client.get("/metrics")).text
    assert caplog.records  # something was logged, so the check below means something
    for secret in (salt, tenant):
        assert secret not in caplog.text and secret not in metrics


async def test_model_names(client: httpx.AsyncClient, engine: AsyncEngine):
    for model in (None, engine.model_name):
        response = await client.post(GENERATE, json=gen_body(max_tokens=1, model=model))
        assert response.status_code == 200
    response = await client.post(GENERATE, json=gen_body(model="no-such-lora"))
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "model"
    await engine_untouched(engine)

"""Bad requests to the engine's server (SECURITY.md's inputs): a 4xx naming the field, the engine
untouched and still serving; oversize bodies; the FCFS engine refusing priorities."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from engine.config import EngineConfig
from engine.loop.async_engine import AsyncEngine
from engine.loop.llm_engine import LLMEngine
from engine.server import create_app
from tests.engine.server.server_helpers import (
    GENERATE,
    engine_untouched,
    gen_body,
)

BAD: list[tuple[str, bytes, str | None]] = [
    ("negative id", json.dumps(gen_body(token_ids=[1, -1])).encode(), "token_ids"),
    ("id past vocab", json.dumps(gen_body(token_ids=[10**9])).encode(), "token_ids"),
    ("empty prompt", json.dumps(gen_body(token_ids=[])).encode(), "token_ids"),
    ("prompt too long", json.dumps(gen_body(token_ids=[1] * 5000)).encode(), "token_ids"),
    (
        "unknown sampling field",
        json.dumps(gen_body(sampling_params={"tempratur": 1})).encode(),
        "sampling_params.tempratur",
    ),
    (
        "max_tokens 0",
        json.dumps(gen_body(sampling_params={"max_tokens": 0})).encode(),
        "sampling_params.max_tokens",
    ),
    ("n 10^6", json.dumps(gen_body(sampling_params={"n": 10**6})).encode(), "sampling_params.n"),
    (
        "logprobs 10^6",
        json.dumps(gen_body(sampling_params={"logprobs": 10**6})).encode(),
        "sampling_params.logprobs",
    ),
    ("priority past int64", json.dumps(gen_body(priority=2**63)).encode(), "priority"),
    ("features", json.dumps(gen_body(features={"pixel_values": []})).encode(), "features"),
    (
        "NaN",
        b'{"token_ids": [1], "sampling_params": {"temperature": NaN}}',
        "sampling_params.temperature",
    ),
    (
        "Infinity",
        b'{"token_ids": [1], "sampling_params": {"top_p": Infinity}}',
        "sampling_params.top_p",
    ),
    ("invalid utf-8", b'{"token_ids": [1], "sampling_params": {}, "cache_salt": "\xc3\x28"}', None),
    (
        "deep nesting",
        b'{"token_ids": [1], "sampling_params": {}, "kv_transfer_params": {"a": '
        + b"[" * 50_000
        + b"]" * 50_000
        + b"}}",
        None,
    ),
    ("array body", b"[1, 2, 3]", None),
    ("not json", b"token_ids=1", None),
    ("empty body", b"", None),
]


@pytest.mark.parametrize(("raw", "param"), [(r, p) for _, r, p in BAD], ids=[n for n, _, _ in BAD])
async def test_bad_requests_are_400_and_leave_the_engine_serving(
    client: httpx.AsyncClient, engine: AsyncEngine, raw: bytes, param: str | None
):
    prompt_tokens = engine.stats().prompt_tokens_total
    response = await client.post(
        GENERATE, content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert error["param"] == param
    if param == "token_ids" and b"-1" in raw:
        assert "token ids must not be negative" in error["message"]
    await engine_untouched(engine)
    assert engine.stats().prompt_tokens_total == prompt_tokens
    ok = await client.post(GENERATE, json=gen_body(max_tokens=1))
    assert ok.status_code == 200


async def test_bodies_over_the_limit_are_413(client: httpx.AsyncClient, engine: AsyncEngine):
    big = b'{"token_ids": [' + b"1," * (4 << 20) + b'1], "sampling_params": {}}'
    assert len(big) > 8 << 20
    response = await client.post(GENERATE, content=big)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"

    async def chunked() -> AsyncIterator[bytes]:  # no content-length: counted while read
        for _ in range(9):
            yield b" " * (1 << 20)

    response = await client.post(GENERATE, content=chunked())
    assert response.status_code == 413
    await engine_untouched(engine)


async def test_fcfs_engine_takes_and_ignores_priority(tiny_model_dir: Path):
    """A gateway sends its tiers' priorities; an fcfs engine serves them in arrival order."""
    llm = LLMEngine(
        EngineConfig(model=str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=4, policy="fcfs")
    )
    engine = AsyncEngine(llm)
    try:
        transport = httpx.ASGITransport(app=create_app(engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
            for priority in (5, -5, 0):
                response = await http.post(GENERATE, json=gen_body(max_tokens=1, priority=priority))
                assert response.status_code == 200, response.text
    finally:
        await engine.shutdown(drain_timeout_s=0)

"""SIGTERM with streams longer than the grace period: every client gets an error event and
`[DONE]` (never a cut connection), a stream short enough to finish within the grace finishes,
every row and settlement is written, and the process exits within grace + 5 s. Meanwhile the
gateway still listens: a new request gets 503 `shutting_down` (a load balancer retries it
elsewhere) and `/ready` 503 `draining`, never a refused connection (issue 45)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
from deployment import deploy
from engine_processes import EngineProcess

GRACE_S = 2.0
NUM_LONG = 6


async def _stream(client: httpx.AsyncClient, url: str, key: str, max_tokens: int) -> list[str]:
    """Every SSE data line until the server ends the response."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Go on and on."}],
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"authorization": f"Bearer {key}"}
    async with client.stream("POST", url, json=body, headers=headers) as r:
        assert r.status_code == 200
        return [line async for line in r.aiter_lines() if line.startswith("data: ")]


async def _answers_while_draining(
    base: str, key: str
) -> tuple[int, httpx.Response, httpx.Response]:
    """New requests after SIGTERM, each on a new connection (as a load balancer's would be),
    until one is not served: how many were (the signal was on its way), that answer, then
    `/ready`'s. A refused connection raises here and fails the test."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Anyone home?"}],
            "max_tokens": 1, "ignore_eos": True, "temperature": 0}  # fmt: skip
    headers = {"authorization": f"Bearer {key}"}
    num_served = 0
    while True:
        async with httpx.AsyncClient(base_url=base, timeout=60) as fresh:
            r = await fresh.post("/v1/chat/completions", json=body, headers=headers)
        if r.status_code != 200:
            async with httpx.AsyncClient(base_url=base, timeout=60) as fresh:
                return num_served, r, await fresh.get("/ready")
        num_served += 1
        await asyncio.sleep(0.02)


async def test_sigterm_ends_long_streams_cleanly_and_keeps_the_books(
    tiny_model_dir: Path, workdir: Path, postgres_url: str, redis_server_url: str
) -> None:
    dep = deploy(
        tiny_model_dir,
        workdir,
        database_url=postgres_url,
        redis_url=redis_server_url,
        LORAGATE_SHUTDOWN_GRACE_S=str(GRACE_S),
    )
    try:
        tenant = dep.tenant()
        url = dep.gateway.url + "/v1/chat/completions"
        async with httpx.AsyncClient(timeout=120) as client:
            longs = [
                asyncio.create_task(_stream(client, url, tenant.key, 1900)) for _ in range(NUM_LONG)
            ]
            # Wait until every long stream is generating, then start one that fits the grace.
            deadline = time.monotonic() + 60
            while dep.engine_metrics().get("vllm:num_requests_running", 0) < NUM_LONG:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            short = asyncio.create_task(_stream(client, url, tenant.key, 8))
            await asyncio.sleep(0.2)
            terminated = asyncio.create_task(asyncio.to_thread(dep.terminate, dep.gateway))
            num_served, refused, ready = await _answers_while_draining(dep.gateway.url, tenant.key)
            took_s = await terminated
            long_lines = await asyncio.gather(*longs)
            short_lines = await short
        rows = await dep.rows(tenant.tenant_id)  # the process has exited: what it left behind
        quota = await dep.quota(tenant.tenant_id)
    finally:
        dep.stop()
    assert took_s <= GRACE_S + 5, f"exited after {took_s:.1f}s"
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "shutting_down" and refused.headers["retry-after"]
    assert (ready.status_code, ready.json()["status"]) == (503, "draining")
    log = dep.gateway.log_text()
    assert "Application shutdown complete" in log
    assert not dep.noisy_logs()
    # Cut at the grace period: an error event, then [DONE], on every long stream.
    for lines in long_lines:
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][6:])["error"]
        assert error["code"] == "engine_error" and "shutting down" in error["message"]
        assert sum('"content"' in line for line in lines) >= 2  # it was streaming
    # The short one finished within the grace, with its usage chunk.
    assert short_lines[-1] == "data: [DONE]"
    assert json.loads(short_lines[-2][6:])["usage"]["completion_tokens"] == 8
    # Rows and settlements were written before the exit.
    assert len(rows) == NUM_LONG + 1 + num_served
    assert sorted(r.finish_reason for r in rows) == ["abort"] * NUM_LONG + ["length"] * (
        1 + num_served
    )
    assert all(0 < r.completion_tokens < 1900 for r in rows if r.finish_reason == "abort")
    assert quota.num_leases == 0
    assert quota.day_tokens == sum(r.prompt_tokens + r.completion_tokens for r in rows)


async def test_sigterm_over_http_engines_answers_503_while_a_stream_drains(
    tiny_model_dir: Path,
    workdir: Path,
    postgres_url: str,
    redis_server_url: str,
    two_engines: list[EngineProcess],
) -> None:
    """The same in the HTTP engine mode, where the app's own signal handler (gateway/app.py)
    drains before uvicorn stops listening."""
    dep = deploy(
        tiny_model_dir, workdir, database_url=postgres_url, redis_url=redis_server_url,
        engines=two_engines, LORAGATE_SHUTDOWN_GRACE_S=str(GRACE_S),
    )  # fmt: skip
    try:
        tenant = dep.tenant()
        url = dep.gateway.url + "/v1/chat/completions"
        async with httpx.AsyncClient(timeout=120) as client:
            long = asyncio.create_task(_stream(client, url, tenant.key, 1900))
            while dep.engine_metrics().get("vllm:num_requests_running", 0) < 1:
                await asyncio.sleep(0.05)
            terminated = asyncio.create_task(asyncio.to_thread(dep.terminate, dep.gateway))
            _, refused, ready = await _answers_while_draining(dep.gateway.url, tenant.key)
            await terminated
            lines = await long
    finally:
        dep.stop()
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    assert (ready.status_code, ready.json()["status"]) == (503, "draining")
    assert lines[-1] == "data: [DONE]"  # cut at the grace period, cleanly

"""SECURITY.md availability, through the gateway: with the Redis quota store down, inference
fails closed with 503 (never 401, never admitted) and recovers by itself when Redis returns."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from gateway_harness import SecretScan, gateway_settings, running_gateway
from services import KillableRedis


@pytest.mark.redis
async def test_redis_down_is_503_and_recovery_is_automatic(
    tiny_model_dir: Path, tmp_path: Path, killable_redis: KillableRedis, secret_scan: SecretScan
) -> None:
    settings = gateway_settings(
        tiny_model_dir, tmp_path, quota_store="redis",
        redis_url=f"redis://127.0.0.1:{killable_redis.port}/0",
    )  # fmt: skip
    async with running_gateway(settings, secret_scan) as gw:
        tenant = await gw.tenant(requests_per_minute=1000)
        body = gw.chat_body("Are you there?", max_tokens=2)

        async def ask() -> int:
            r = await gw.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "quota_store_unavailable"
                assert "retry-after" in r.headers
            return r.status_code

        assert await ask() == 200
        killable_redis.stop()
        assert await ask() == 503
        assert await ask() == 503  # never a 401, never admitted without the store
        killable_redis.start()
        deadline = time.monotonic() + 15
        while (status := await ask()) != 200:
            assert status == 503 and time.monotonic() < deadline
            await asyncio.sleep(0.2)

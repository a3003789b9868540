"""Redis stopped, PostgreSQL stopped, engine saturated: three different 503 codes (and rejection
metric reasons), each with `Retry-After`; the service recovers within 1 s of the dependency's
return (a requirement of the issue, not a speed benchmark), and no usage row is lost.

Each dependency is a private server the test may kill: a crash (`pg_ctl -m immediate`, SIGKILL
for Redis), not a polite stop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from deployment import Deployment, deploy
from gateway_process import TenantInfo
from services import KillablePostgres, KillableRedis, create_database

RECOVERY_S = 1.0


class Client:
    """Non-streamed chat requests, counting every answer by status and code."""

    def __init__(self, dep: Deployment, tenant: TenantInfo) -> None:
        self._url = dep.gateway.url + "/v1/chat/completions"
        self._headers = {"authorization": f"Bearer {tenant.key}"}
        self.num_ok = 0
        self.codes: dict[str, int] = {}

    async def ask(self, client: httpx.AsyncClient, max_tokens: int = 4) -> httpx.Response:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Still up?"}],
                "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}  # fmt: skip
        r = await client.post(self._url, json=body, headers=self._headers)
        if r.status_code == 200:
            self.num_ok += 1
        else:
            code = r.json()["error"]["code"]
            self.codes[code] = self.codes.get(code, 0) + 1
        return r

    async def until(
        self, client: httpx.AsyncClient, done: Callable[[httpx.Response], bool], timeout_s: float
    ) -> httpx.Response:
        deadline = time.monotonic() + timeout_s
        while not done(r := await self.ask(client)):
            assert time.monotonic() < deadline, f"still {r.status_code}: {r.text[:200]}"
            await asyncio.sleep(0.02)
        return r


def _refused_with(code: str) -> Callable[[httpx.Response], bool]:
    return lambda r: r.status_code == 503 and r.json()["error"]["code"] == code


def _ok(r: httpx.Response) -> bool:
    return r.status_code == 200


async def test_each_outage_has_its_code_and_the_service_recovers_without_losing_rows(
    tiny_model_dir: Path,
    workdir: Path,
    killable_redis: KillableRedis,
    killable_postgres: KillablePostgres,
) -> None:
    database_url = await create_database(killable_postgres.url)
    dep = deploy(
        tiny_model_dir,
        workdir,
        database_url=database_url,
        redis_url=f"redis://127.0.0.1:{killable_redis.port}/0",
        LORAGATE_ENGINE__MAX_QUEUE_LEN="3",
    )
    try:
        tenant = dep.tenant()
        asker = Client(dep, tenant)
        recovery: dict[str, float] = {}
        async with httpx.AsyncClient(timeout=120) as client:
            assert (await asker.ask(client)).status_code == 200

            # Redis (the quota store) crashes: fail closed, never admitted, never 401.
            killable_redis.stop()
            r = await asker.until(client, _refused_with("quota_store_unavailable"), 10)
            assert r.headers["retry-after"]
            killable_redis.start()
            back = time.monotonic()
            await asker.until(client, _ok, 10)
            recovery["redis"] = time.monotonic() - back

            # PostgreSQL crashes: requests whose key and policy are cached go on (their rows
            # wait in memory); once the caches expire, 503 database_unavailable.
            killable_postgres.stop()
            r = await asker.until(client, _refused_with("database_unavailable"), 30)
            assert r.headers["retry-after"]
            killable_postgres.start()
            back = time.monotonic()
            await asker.until(client, _ok, 10)
            recovery["postgres"] = time.monotonic() - back

            # The engine's queue is full (3 long requests in flight): 503 overloaded.
            hold = {**{"model": "tiny", "messages": [{"role": "user", "content": "Hold on."}]},
                    "max_tokens": 1500, "ignore_eos": True}  # fmt: skip
            headers = {"authorization": f"Bearer {tenant.key}"}
            url = dep.gateway.url + "/v1/chat/completions"
            holders = [
                asyncio.create_task(client.post(url, json=hold, headers=headers)) for _ in range(3)
            ]
            while dep.engine_metrics().get("vllm:num_requests_running", 0) < 3:
                await asyncio.sleep(0.05)
            r = await asker.ask(client)
            assert _refused_with("overloaded")(r), r.text
            assert r.headers["retry-after"]
            for holder in holders:  # the clients give up: the gateway aborts their requests
                holder.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
            back = time.monotonic()
            await asker.until(client, _ok, 10)
            recovery["engine"] = time.monotonic() - back
        metrics = httpx.get(dep.gateway.url + "/metrics", timeout=10).text
    finally:
        dep.stop()
    assert {"quota_store_unavailable", "database_unavailable", "overloaded"} <= set(asker.codes)
    for reason in ("quota_store_unavailable", "database_unavailable", "overloaded"):
        assert f'reason="{reason}"' in metrics
    assert all(took <= RECOVERY_S for took in recovery.values()), recovery
    # No lost rows: every answered request, and every admitted one the engine refused or the
    # client abandoned, has its row (written after PostgreSQL came back).
    rows = await dep.wait_rows(tenant.tenant_id, asker.num_ok + asker.codes["overloaded"] + 3)
    assert sum(r.finish_reason == "length" for r in rows) == asker.num_ok
    assert sum(r.finish_reason == "rejected" for r in rows) == asker.codes["overloaded"]
    assert sum(r.finish_reason == "abort" for r in rows) == 3  # the three that gave up
    assert len({r.request_id for r in rows}) == len(rows)
    assert not dep.noisy_logs()

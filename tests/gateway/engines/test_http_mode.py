"""Acceptance 7: the gateway over two engine server processes (distributed mode: HTTP engines,
Redis quotas). Requests spread over both; an adapter's requests go to the replica holding it;
when one engine is killed, an in-flight stream on it ends with an error event and its usage is
recorded, and new requests go to the other."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from engine_processes import EngineProcess, start_engines
from gateway_harness import ADMIN_CTX, Gateway, SecretScan, gateway_settings
from live_server import live_gateway

from gateway.dashboard.views import engines_page
from gateway.demo.adapters import demo_adapter_files
from gateway.engines.status import engine_status
from tenancy.auth.principal import Principal
from tenancy.auth.scopes import Scope
from tenancy.crud.adapters import register_adapter

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def engines(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[EngineProcess]]:
    procs = start_engines(tiny_model_dir, tmp_path_factory.mktemp("engines"), 2)
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live(
    engines: list[EngineProcess],
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    redis_server_url: str,
    secret_scan: SecretScan,
) -> AsyncIterator[tuple[str, Gateway]]:
    settings = gateway_settings(
        tiny_model_dir,
        tmp_path_factory.mktemp("http-mode"),
        engine_mode="http",
        engine_urls=[e.url for e in engines],
        engine_poll_interval_s=0.3,
        # These engines have no adapter source (the gateway's URL is known only once it runs):
        # they load from the directory store's paths, as before the blob store.
        adapter_store="directory",
        quota_store="redis",
        redis_url=redis_server_url,
        redis_key_prefix=f"lgtest:{uuid.uuid4().hex[:12]}:",
    )
    async with live_gateway(settings) as (url, state):  # noqa: SIM117 (url comes from it)
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            yield url, Gateway(state=state, client=client, scan=secret_scan)


def _served(engine: EngineProcess) -> float:
    return engine.metric("vllm:request_success_total")


async def test_requests_spread_over_both_replicas(
    live: tuple[str, Gateway], engines: list[EngineProcess]
) -> None:
    _, gw = live
    tenant = await gw.tenant()
    before = [_served(e) for e in engines]
    body = gw.chat_body("Spread the work, please.", max_tokens=20, ignore_eos=True)
    results = await asyncio.gather(
        *(gw.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
          for _ in range(8))
    )  # fmt: skip
    assert all(r.status_code == 200 for r in results)
    texts = {r.json()["choices"][0]["message"]["content"] for r in results}
    assert len(texts) == 1  # greedy: both replicas give the same answer
    served = [_served(e) - b for e, b in zip(engines, before, strict=True)]
    assert sum(served) == 8 and min(served) >= 2
    records = await gw.usage_records(tenant)
    assert len(records) == 8 and {r.finish_reason for r in records} == {"length"}


async def _own_adapter(gw: Gateway, tenant_id: str, name: str, seed: int) -> tuple[str, str]:
    """Register an adapter for the tenant (as an admin upload would): (adapter id, path)."""
    async with gw.state.tenancy.sessionmaker() as session:
        row = await register_adapter(
            session, ctx=ADMIN_CTX, service=gw.state.tenancy.adapters, tenant_id=tenant_id,
            name=name, uploads=demo_adapter_files(gw.state.settings.base_model, seed=seed),
        )  # fmt: skip
    return row.id, row.storage_path


async def test_adapter_requests_go_to_the_replica_holding_the_adapter(
    live: tuple[str, Gateway], engines: list[EngineProcess]
) -> None:
    _, gw = live
    tenant = await gw.tenant()
    held_id, held_path = await _own_adapter(gw, tenant.tenant_id, "held", seed=3)
    # Only engine 1 holds "held" (loaded out of band, as after an earlier request).
    r = httpx.post(
        engines[1].url + "/v1/load_lora_adapter",
        json={"lora_name": held_id, "lora_path": held_path},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    client = gw.state.engine
    while not client.replicas[1].adapters.get(held_id):  # type: ignore[attr-defined]
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    before = [_served(e) for e in engines]
    body = gw.chat_body("Route me to my adapter.", max_tokens=3, model="held")
    for _ in range(5):
        r = await gw.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
        assert r.status_code == 200, r.text
    assert [_served(e) - b for e, b in zip(engines, before, strict=True)] == [0, 5]
    # An adapter no replica holds is loaded where the request goes, and its next requests follow.
    await _own_adapter(gw, tenant.tenant_id, "fresh", seed=4)
    before = [_served(e) for e in engines]
    body = gw.chat_body("Load me somewhere.", max_tokens=3, model="fresh")
    for _ in range(4):
        r = await gw.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
        assert r.status_code == 200, r.text
    served = [_served(e) - b for e, b in zip(engines, before, strict=True)]
    assert sorted(served) == [0, 4]


async def test_engine_status_reads_each_replica(live: tuple[str, Gateway]) -> None:
    """The dashboard's engines page in HTTP mode: each replica's health, its running, waiting
    and KV gauges from its /metrics, its adapters by tier under their tenants' names (after the
    test above: `held` on engine-1)."""
    _, gw = live
    replicas = await engine_status(gw.state.engine)
    assert [r.name for r in replicas] == ["engine-0", "engine-1"]
    for replica in replicas:
        assert replica.healthy and replica.num_running == 0 and replica.num_waiting == 0
        assert replica.kv_usage is not None and 0 <= replica.kv_usage <= 1
    admin = Principal(subject="test", tenant_id=None, scopes=frozenset({Scope.ADMIN}))
    rows = {row.status.name: row for row in await engines_page(gw.state, admin)}
    assert any("held" in names for names in rows["engine-1"].adapters.values())
    nobody = Principal(subject="t", tenant_id=None, scopes=frozenset({Scope.TENANT_ADMIN}))
    hidden = {row.status.name: row for row in await engines_page(gw.state, nobody)}
    assert not hidden["engine-1"].adapters and sum(hidden["engine-1"].num_hidden.values()) >= 1


async def test_killed_replica_mid_stream(
    live: tuple[str, Gateway], engines: list[EngineProcess]
) -> None:
    _, gw = live
    tenant = await gw.tenant()
    body = gw.chat_body("A very long story.", max_tokens=1500, ignore_eos=True, stream=True,
                        stream_options={"include_usage": True})  # fmt: skip
    events: list[dict] = []
    async with gw.client.stream(
        "POST", "/v1/chat/completions", headers=tenant.headers, json=body
    ) as response:
        assert response.status_code == 200
        lines = response.aiter_lines()
        async for line in lines:
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                if sum(bool(e["choices"] and e["choices"][0]["delta"].get("content"))
                       for e in events) >= 3:  # fmt: skip
                    break
        running = [e for e in engines if e.metric("vllm:num_requests_running") >= 1]
        assert len(running) == 1
        victim, survivor = running[0], next(e for e in engines if e is not running[0])
        victim.kill()
        rest = [line async for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][6:])
    assert error["error"]["type"] == "server_error"
    received = sum(
        bool(e["choices"] and e["choices"][0]["delta"].get("content"))
        for e in [*events, *(json.loads(x[6:]) for x in rest[:-2])]
    )
    # The usage of what was produced is recorded, with finish reason `error`.
    deadline = time.monotonic() + 10
    while not (records := await gw.usage_records(tenant)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert len(records) == 1
    assert records[0].finish_reason == "error"
    assert records[0].completion_tokens >= received >= 3
    # New requests go to the surviving replica.
    before = _served(survivor)
    for _ in range(4):
        r = await gw.client.post(
            "/v1/chat/completions", headers=tenant.headers,
            json=gw.chat_body("Still there?", max_tokens=3),
        )  # fmt: skip
        assert r.status_code == 200, r.text
    assert _served(survivor) - before == 4
    # Settlement runs right after each answer is sent: give the last one a moment.
    deadline = time.monotonic() + 5
    while (await gw.state.tenancy.quotas.usage(f"t:{tenant.tenant_id}")).num_leases:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    ready = await gw.client.get("/ready")
    assert ready.status_code == 200  # one engine is enough to serve
    assert sorted(ready.json()["engines"].values()) == [False, True]

"""Acceptance 6: streaming clients that disconnect mid-stream leave nothing behind.

200 clients each read the first generated text of a long stream and hang up. Afterwards the
engine runs nothing and every KV block is free, every quota lease is settled, and the ledger
holds 200 records with finish reason `abort`, each counting the tokens actually produced.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from gateway_harness import Gateway, SecretScan, gateway_settings
from live_server import live_gateway
from sqlalchemy import select

from gateway.state import GatewayState
from tenancy.sql.models import UsageRecord

pytestmark = pytest.mark.asyncio(loop_scope="module")

NUM_CLIENTS = 200


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, secret_scan: SecretScan
) -> AsyncIterator[tuple[str, Gateway]]:
    settings = gateway_settings(
        tiny_model_dir, tmp_path_factory.mktemp("disconnects"), engine={"max_num_seqs": 64}
    )
    async with live_gateway(settings) as (url, state):  # noqa: SIM117 (url comes from it)
        async with httpx.AsyncClient(base_url=url) as client:
            yield url, Gateway(state=state, client=client, scan=secret_scan)


async def _read_some_then_hang_up(client: httpx.AsyncClient, key: str, body: dict) -> int:
    """Returns how many text chunks arrived before hanging up."""
    headers = {"authorization": f"Bearer {key}"}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        texts = 0
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                texts += bool(delta.get("content"))
                if texts >= 1:
                    break  # leaving the block closes the connection mid-stream
        return texts


async def _settled(state: GatewayState, tenant_id: str, timeout_s: float = 60.0) -> None:
    engine = state.engine.engine  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = engine.stats()
        usage = await state.tenancy.quotas.usage(f"t:{tenant_id}")
        if (
            stats.num_running == 0
            and stats.num_waiting == 0
            and engine.num_in_flight == 0
            and usage.num_leases == 0
        ):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not settled: {engine.stats()} leases={usage.num_leases}")


async def _records(state: GatewayState, tenant_id: str) -> list[UsageRecord]:
    await state.usage.flush()
    async with state.tenancy.sessionmaker() as session:
        rows = await session.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id))
        return list(rows.all())


@pytest.mark.parametrize(
    "num_clients",
    [NUM_CLIENTS, pytest.param(1000, marks=pytest.mark.slow)],  # SECURITY.md: 1,000 streams
    ids=["200", "1000"],
)
async def test_streams_cut_mid_flight_leave_nothing_behind(
    live: tuple[str, Gateway], num_clients: int
) -> None:
    url, gw = live
    tenant = await gw.tenant()
    body = gw.chat_body("Tell me everything.", max_tokens=1500, ignore_eos=True, stream=True)
    limits = httpx.Limits(max_connections=num_clients + 10)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        got = await asyncio.gather(
            *(_read_some_then_hang_up(client, tenant.key, body) for _ in range(num_clients))
        )
    assert all(n >= 1 for n in got)
    await _settled(gw.state, tenant.tenant_id)
    engine = gw.state.engine.engine  # type: ignore[attr-defined]
    assert engine.stats().kv_usage == 0.0  # every KV block is free
    await engine.run_in_loop(lambda e: e.check_invariants())
    records = await _records(gw.state, tenant.tenant_id)
    assert len(records) == num_clients
    assert {r.finish_reason for r in records} == {"abort"}
    assert all(1 <= r.completion_tokens < 1500 for r in records)
    assert len({r.request_id for r in records}) == num_clients


async def test_clients_gone_while_queued_are_settled_too(live: tuple[str, Gateway]) -> None:
    """Hanging up before the first token (waiting in the engine's queue) also settles."""
    url, gw = live
    tenant = await gw.tenant()
    busy = gw.chat_body("Keep going.", max_tokens=300, ignore_eos=True)
    queued = gw.chat_body("Me too.", max_tokens=300, ignore_eos=True, stream=True)
    headers = {"authorization": f"Bearer {tenant.key}"}
    engine = gw.state.engine.engine  # type: ignore[attr-defined]

    async def until(predicate: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 60
        while not predicate():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        # Fill the running batch, then queue more and give up on them while they wait.
        fill = [
            asyncio.create_task(client.post("/v1/chat/completions", json=busy, headers=headers))
            for _ in range(64)
        ]
        await until(lambda: engine.stats().num_running == 64)
        waiting = [
            asyncio.create_task(client.post("/v1/chat/completions", json=queued, headers=headers))
            for _ in range(20)
        ]
        await until(lambda: engine.stats().num_waiting == 20)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for task in fill:
            task.cancel()
        await asyncio.gather(*fill, return_exceptions=True)
    await _settled(gw.state, tenant.tenant_id)
    assert gw.state.engine.engine.stats().kv_usage == 0.0  # type: ignore[attr-defined]
    records = await _records(gw.state, tenant.tenant_id)
    assert len(records) == 84
    assert {r.finish_reason for r in records} == {"abort"}
    assert sum(r.completion_tokens == 0 for r in records) == 20  # never got a token

"""Real impolite clients against a real `loragate serve` (Redis quota store, PostgreSQL ledger,
the real engine in process).

100 streams through the official OpenAI SDK's sync client and 100 through its async client
(each breaks out of its iterator at `[DONE]` and closes the response without reading on), 100
httpx streams closed right after `[DONE]`, and 100 raw sockets closed at random byte offsets
(from right after sending to past the end, a third with a reset instead of a FIN). Then raw
sockets that leave before their request is even sent whole (mid-headers, mid-body).

Every admitted request has exactly one usage row, and the token counts equal what the engine
produced: per client, the row equals the usage chunk the client saw; per phase (a tenant of its
own), the sum of the rows' completion tokens equals the growth of the engine's
`vllm:generation_tokens_total` counter. Afterwards every lease is settled, the engine runs
nothing and every KV block is free, and the gateway's log holds no traceback and no unretrieved
future (a client that leaves is an INFO line at most).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
import openai
import pytest
import pytest_asyncio
from clients import (
    RawOutcome,
    Seen,
    chat_body,
    gateway_counter,
    httpx_stream,
    raw_request,
    raw_socket,
    sdk_async_stream,
    sdk_sync_stream,
)
from deployment import Deployment, deploy
from gateway_process import TenantInfo
from services import create_database, drop_database

from tenancy.sql.models import UsageRecord

pytestmark = pytest.mark.asyncio(loop_scope="module")

NUM_CLIENTS = 100
NUM_MID_REQUEST = 40  # raw sockets that leave before their request is sent whole
CONCURRENCY = 25  # clients of one kind at a time: enough churn, and a 2-core box copes
MIN_TOKENS, MAX_TOKENS = 8, 64
SEED = 20250611
SETTLE_TIMEOUT_S = 120.0
GENERATED = "vllm:generation_tokens_total"
REQUESTS = "loragate_gateway_requests_total"

T = TypeVar("T")


@dataclass
class Live:
    gw: Deployment
    tenants: list[TenantInfo]  # every tenant the module used: all must end with no lease


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live(
    tiny_model_dir: Path,
    postgres_server_url: str,
    redis_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Live]:
    database_url = await create_database(postgres_server_url)
    try:
        gw = await asyncio.to_thread(
            deploy,
            tiny_model_dir,
            tmp_path_factory.mktemp("impolite"),
            database_url=database_url,
            redis_url=redis_server_url,
        )
        try:
            yield Live(gw=gw, tenants=[])
        finally:
            gw.stop()
    finally:
        await drop_database(postgres_server_url, database_url)


# ---- phases -------------------------------------------------------------------------------------


@dataclass
class Phase:
    """One client kind's run: a tenant of its own and the engine's counter before it."""

    tenant: TenantInfo
    generated_before: float


async def start_phase(m: Live) -> Phase:
    metrics = await m.gw.wait_engines_idle()
    assert _busy(metrics) == 0, metrics
    tenant = await asyncio.to_thread(m.gw.tenant)
    m.tenants.append(tenant)
    return Phase(tenant=tenant, generated_before=metrics[GENERATED])


def _busy(metrics: dict[str, float]) -> float:
    return metrics["vllm:num_requests_running"] + metrics["vllm:num_requests_waiting"]


async def bounded(n: int, make: Callable[[int], Awaitable[T]]) -> list[T]:
    """`make(0..n-1)`, at most CONCURRENCY at a time."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> T:
        async with gate:
            return await make(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


def token_budgets(kind: str) -> list[int]:
    rng = random.Random(f"{SEED}-{kind}")
    return [rng.randint(MIN_TOKENS, MAX_TOKENS) for _ in range(NUM_CLIENTS)]


async def finish_phase(m: Live, phase: Phase, rows: list[UsageRecord]) -> None:
    """The engine is idle, its KV cache empty, and it generated exactly the rows' tokens; the
    tenant holds no lease; the log is quiet."""
    metrics = await m.gw.wait_engines_idle()
    assert _busy(metrics) == 0, metrics
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0, metrics
    generated = metrics[GENERATED] - phase.generated_before
    assert generated == sum(r.completion_tokens for r in rows), (
        f"the engine generated {generated} tokens, the ledger holds "
        f"{sum(r.completion_tokens for r in rows)}"
    )
    assert (await m.gw.quota(phase.tenant.tenant_id)).num_leases == 0
    assert len({r.request_id for r in rows}) == len(rows)  # one row per request
    assert len(await m.gw.rows(phase.tenant.tenant_id)) == len(rows)  # and none came late
    assert gateway_counter(m.gw.gateway.url, REQUESTS, phase.tenant.tenant_id) == len(rows)
    assert m.gw.noisy_logs() == []


async def check_read_to_done(m: Live, phase: Phase, budgets: list[int], seen: list[Seen]) -> None:
    """Clients that read up to `[DONE]`: each saw its whole answer, and its row equals the
    usage chunk it saw."""
    assert [s.completion_tokens for s in seen] == budgets  # ignore_eos: exactly max_tokens
    assert {s.finish_reason for s in seen} == {"length"}
    assert all(s.prompt_tokens > 0 for s in seen)
    by_id = {s.request_id: s for s in seen}
    assert len(by_id) == NUM_CLIENTS
    rows = await m.gw.wait_rows(phase.tenant.tenant_id, NUM_CLIENTS, timeout_s=SETTLE_TIMEOUT_S)
    assert len(rows) == NUM_CLIENTS
    assert {r.request_id for r in rows} == set(by_id)
    for row in rows:
        s = by_id[row.request_id]
        assert (row.prompt_tokens, row.completion_tokens, row.finish_reason) == (
            s.prompt_tokens,
            s.completion_tokens,
            "length",
        ), row.request_id
        if s.cached_tokens is not None:
            assert row.cached_tokens == s.cached_tokens, row.request_id
    await finish_phase(m, phase, rows)


# ---- the four kinds of client -------------------------------------------------------------------


async def test_openai_sdk_sync_client(live: Live) -> None:
    phase = await start_phase(live)
    budgets = token_budgets("sdk-sync")
    client = openai.OpenAI(
        base_url=live.gw.gateway.base_url, api_key=phase.tenant.key, max_retries=0, timeout=120
    )
    loop = asyncio.get_running_loop()
    try:
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as threads:
            seen = await asyncio.gather(
                *(
                    loop.run_in_executor(threads, sdk_sync_stream, client, chat_body(i, n))
                    for i, n in enumerate(budgets)
                )
            )
    finally:
        client.close()
    await check_read_to_done(live, phase, budgets, seen)


async def test_openai_sdk_async_client(live: Live) -> None:
    phase = await start_phase(live)
    budgets = token_budgets("sdk-async")
    client = openai.AsyncOpenAI(
        base_url=live.gw.gateway.base_url, api_key=phase.tenant.key, max_retries=0, timeout=120
    )
    try:
        seen = await bounded(
            NUM_CLIENTS, lambda i: sdk_async_stream(client, chat_body(i, budgets[i]))
        )
    finally:
        await client.close()
    await check_read_to_done(live, phase, budgets, seen)


async def test_httpx_streams_closed_at_done(live: Live) -> None:
    phase = await start_phase(live)
    budgets = token_budgets("httpx")
    url, key = live.gw.gateway.url, phase.tenant.key
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        seen = await bounded(
            NUM_CLIENTS, lambda i: httpx_stream(client, url, key, chat_body(i, budgets[i]))
        )
    await check_read_to_done(live, phase, budgets, seen)


@dataclass(frozen=True)
class RawPlan:
    max_tokens: int
    read_bytes: int  # 0: closed right after sending; past the response: read to its end
    reset: bool  # closed with SO_LINGER 0 (a reset) rather than a FIN

    @property
    def reads_all(self) -> bool:
        return self.read_bytes == WHOLE


WHOLE = 1 << 30  # more bytes than any response here


async def _full_response_size(m: Live, max_tokens: int) -> int:
    """Bytes of a whole streamed response (a polite raw read, on a tenant of its own)."""
    tenant = await asyncio.to_thread(m.gw.tenant)
    m.tenants.append(tenant)
    request = raw_request(m.gw.gateway.url, tenant.key, chat_body(0, max_tokens))
    got = await raw_socket(
        m.gw.gateway.url, request, send_bytes=len(request), read_bytes=WHOLE, reset=False
    )
    assert got.got_headers and got.received.endswith(b"0\r\n\r\n"), got.received[-200:]
    return len(got.received)


def raw_plans(size_of: Callable[[int], float]) -> list[RawPlan]:
    """Offsets from 0 (closed right after sending) through the headers and the stream to past
    the end; a third of the sockets reset rather than close."""
    rng = random.Random(f"{SEED}-raw")
    plans = []
    for _ in range(NUM_CLIENTS):
        max_tokens = rng.randint(MIN_TOKENS, MAX_TOKENS)
        shape = rng.random()
        if shape < 0.2:
            read_bytes = 0
        elif shape < 0.4:
            read_bytes = WHOLE
        else:  # anywhere in the answer, its estimated size give or take
            read_bytes = rng.randint(1, int(size_of(max_tokens) * 1.1))
        plans.append(RawPlan(max_tokens, read_bytes, reset=rng.random() < 0.35))
    return plans


async def settle_raw(m: Live, tenant_id: str) -> list[UsageRecord]:
    """The tenant's rows once nothing moves: the engine idle, no lease held, every admitted
    request (the gateway's own count) recorded, the same over a few polls in a row (a request
    whose client has long gone may still be on its way in)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last: tuple[float, ...] = ()
    steady = 0
    while True:
        metrics = m.gw.engine_metrics()
        leases = (await m.gw.quota(tenant_id)).num_leases
        admitted = gateway_counter(m.gw.gateway.url, REQUESTS, tenant_id)
        rows = await m.gw.rows(tenant_id)
        now = (_busy(metrics), leases, admitted, len(rows), metrics[GENERATED])
        settled = now[:2] == (0, 0) and admitted == len(rows)
        steady = steady + 1 if settled and now == last else 0
        if steady >= 3:
            return rows
        assert time.monotonic() < deadline, f"not settled: busy, leases, admitted, rows = {now}"
        last = now
        await asyncio.sleep(0.3)


async def test_raw_sockets_closed_at_random_offsets(live: Live) -> None:
    url = live.gw.gateway.url
    small_size = await _full_response_size(live, MIN_TOKENS)
    large_size = await _full_response_size(live, MAX_TOKENS)
    phase = await start_phase(live)
    key = phase.tenant.key

    def size_of(max_tokens: int) -> float:
        share = (max_tokens - MIN_TOKENS) / (MAX_TOKENS - MIN_TOKENS)
        return small_size + (large_size - small_size) * share

    plans = raw_plans(size_of)
    requests = [raw_request(url, key, chat_body(i, p.max_tokens)) for i, p in enumerate(plans)]
    outcomes: list[RawOutcome] = await bounded(
        NUM_CLIENTS,
        lambda i: raw_socket(
            url,
            requests[i],
            send_bytes=len(requests[i]),
            read_bytes=plans[i].read_bytes,
            reset=plans[i].reset,
        ),
    )
    rows = await settle_raw(live, phase.tenant.tenant_id)
    by_id = {r.request_id: r for r in rows}
    assert len(by_id) == len(rows) <= NUM_CLIENTS

    # Every request that got its response headers was admitted, and has its row.
    assert sum(o.got_headers for o in outcomes) <= len(rows)
    for plan, got in zip(plans, outcomes, strict=True):
        if plan.reads_all:
            assert got.got_headers and got.got_done, got.received[-200:]
        ids = got.response_ids
        assert len(ids) <= 1
        for request_id in ids:
            row = by_id[request_id]
            assert row.completion_tokens <= plan.max_tokens, request_id
            if row.finish_reason == "length":
                assert row.completion_tokens == plan.max_tokens, request_id
            if got.got_done:  # read to the end: the row equals the usage chunk
                usage = got.usage()
                assert usage is not None
                assert row.finish_reason == "length"
                assert row.prompt_tokens == usage["prompt_tokens"]
                assert row.completion_tokens == usage["completion_tokens"] == plan.max_tokens
    # Cut anywhere: aborted (0 tokens if before the first) or run to max_tokens.
    reasons = Counter(r.finish_reason for r in rows)
    assert set(reasons) <= {"abort", "length"}, reasons
    await finish_phase(live, phase, rows)
    print(
        f"raw sockets: {len(rows)} admitted, {sum(o.got_headers for o in outcomes)} got headers,"
        f" {sum(o.got_done for o in outcomes)} read to [DONE]; rows: {dict(reasons)},"
        f" {sum(r.completion_tokens == 0 for r in rows)} with no token"
    )


async def test_clients_leaving_mid_request(live: Live) -> None:
    """Clients that leave before their request is sent whole (in its headers or in its body)
    are never admitted, and leave at most an INFO line: no traceback, no
    `unhandled ClientDisconnect`."""
    phase = await start_phase(live)
    url, key = live.gw.gateway.url, phase.tenant.key
    rng = random.Random(f"{SEED}-mid-request")
    cuts = []
    for i in range(NUM_MID_REQUEST):
        request = raw_request(url, key, chat_body(i, rng.randint(MIN_TOKENS, MAX_TOKENS)))
        head = request.index(b"\r\n\r\n") + 4
        send = rng.randint(1, head - 1) if i % 2 else rng.randint(head, len(request) - 1)
        cuts.append((request, send, rng.random() < 0.35))
    await bounded(
        NUM_MID_REQUEST,
        lambda i: raw_socket(
            url, cuts[i][0], send_bytes=cuts[i][1], read_bytes=0, reset=cuts[i][2]
        ),
    )
    rows = await settle_raw(live, phase.tenant.tenant_id)
    assert rows == []
    await finish_phase(live, phase, rows)
    log = live.gw.gateway.log_text()
    assert "ClientDisconnect" not in log, [
        line for line in log.splitlines() if "ClientDisconnect" in line
    ]


async def test_everything_settled(live: Live) -> None:
    """After all the churn: no tenant holds a lease, the engine is idle with every KV block
    free, and no gateway log holds a traceback or an unretrieved future."""
    metrics = await live.gw.wait_engines_idle()
    assert _busy(metrics) == 0, metrics
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0, metrics
    for tenant in live.tenants:
        assert (await live.gw.quota(tenant.tenant_id)).num_leases == 0, tenant
    assert live.gw.noisy_logs() == []

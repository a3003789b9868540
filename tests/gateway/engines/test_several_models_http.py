"""Issue 44, acceptance 3, distributed: tiny and small behind one gateway in HTTP mode, each
model its own engine server process (`loragate engine`), small's named in LORAGATE_MODELS with
its own engine_urls. Each request reaches its model's engine (the engines' own request counters
say so), an adapter of small's with it; readiness and the dashboard's engines page list both
pools."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from engine_processes import EngineProcess, start_engines
from gateway_harness import ADMIN_CTX, Gateway, SecretScan, gateway_settings
from live_server import live_gateway

from gateway.dashboard.views import engines_page
from gateway.demo.adapters import demo_adapter_files
from tenancy.crud.adapters import register_adapter

pytestmark = pytest.mark.asyncio(loop_scope="module")

SMALL = "small"


@pytest.fixture(scope="module")
def engines(
    model_factory: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, EngineProcess]]:
    work = tmp_path_factory.mktemp("engines")
    started: dict[str, EngineProcess] = {}
    try:
        (started["tiny"],) = start_engines(model_factory(), work, 1)
        (started[SMALL],) = start_engines(
            model_factory(size=SMALL), work, 1, "--served-model-name", SMALL
        )
        yield started
    finally:
        for proc in started.values():
            proc.kill()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live(
    engines: dict[str, EngineProcess],
    model_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
    secret_scan: SecretScan,
) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        model_factory(), tmp_path_factory.mktemp("several-http"),
        engine_mode="http", engine_urls=[engines["tiny"].url], engine_poll_interval_s=0.3,
        models=[{"name": SMALL, "path": str(model_factory(size=SMALL)),
                 "engine_urls": [engines[SMALL].url]}],
        # The engines know no gateway URL to fetch adapters from: directory-store paths.
        adapter_store="directory",
    )  # fmt: skip
    async with live_gateway(settings) as (url, state):  # noqa: SIM117 (url comes from it)
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            yield Gateway(state=state, client=client, scan=secret_scan)


def _served(engines: dict[str, EngineProcess]) -> dict[str, float]:
    return {name: e.metric("vllm:request_success_total") for name, e in engines.items()}


async def test_each_model_on_its_own_engine(
    live: Gateway, engines: dict[str, EngineProcess]
) -> None:
    gw = live
    tenant = await gw.tenant()
    async with gw.state.tenancy.sessionmaker() as session:
        await register_adapter(
            session, ctx=ADMIN_CTX, service=gw.state.tenancy.adapters, tenant_id=tenant.tenant_id,
            name="s-ad", uploads=demo_adapter_files(gw.state.others[SMALL].base, seed=9),
            base_model=SMALL,
        )  # fmt: skip
    for model, counts in (("tiny", [1, 0]), (SMALL, [0, 1]), ("s-ad", [0, 1])):
        before = _served(engines)
        body = gw.chat_body("Which engine am I on?", model=model, max_tokens=3)
        r = await gw.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
        assert r.status_code == 200 and r.json()["model"] == model, r.text
        after = _served(engines)
        assert [after[n] - before[n] for n in ("tiny", SMALL)] == counts, model
    r = await gw.client.get("/ready")
    assert r.status_code == 200, r.text
    assert r.json()["engines"] == {"engine-0": True, "small/engine-0": True}
    # small's adapter was loaded on small's engine only (as the poller next sees it)
    deadline = time.monotonic() + 10
    while True:
        rows = await engines_page(gw.state, ADMIN_CTX.principal)
        if "s-ad" in {n for names in rows[1].adapters.values() for n in names}:
            break
        assert time.monotonic() < deadline, rows[1]
        await asyncio.sleep(0.1)
    assert [row.status.name for row in rows] == ["engine-0", "small/engine-0"]
    assert all(row.status.healthy for row in rows)
    assert not rows[0].adapters

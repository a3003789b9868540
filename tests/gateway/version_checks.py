"""What the adapter version tests share: an engine client that notes which version served each
engine request (and can hold admitted requests before the engine), the admin's headers, an
upload of the next version of `support`, and the switch of its alias under 200 requests in
flight (issue 44, acceptance 2), run on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from gateway_harness import Gateway, RecordingClient, TenantKey

from engine.protocol import GenerateRequest
from gateway.demo.adapters import demo_adapter_files
from gateway.engines.api import EngineStream
from gateway.policy import AdapterRef
from tenancy.auth.bootstrap import bootstrap_admin

NUM_IN_FLIGHT = 200


class AdapterLog(RecordingClient):
    """The real engine client, noting which adapter each engine request went to; while `gate`
    is clear, admitted requests wait before reaching the engine (so they stay in flight)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.served: list[tuple[str, str | None]] = []  # (engine request id, engine name)
        self.gate = asyncio.Event()
        self.gate.set()

    async def open(
        self, request: GenerateRequest, adapter: AdapterRef | None, traceparent: str | None = None
    ) -> EngineStream:
        self.served.append((request.request_id, adapter.engine_name if adapter else None))
        await self.gate.wait()
        return await super().open(request, adapter, traceparent)


async def admin_headers(gw: Gateway) -> dict[str, str]:
    runtime = gw.state.tenancy
    async with runtime.sessionmaker() as session:
        created = await bootstrap_admin(
            session, minter=runtime.minter, tiers=runtime.tier_names,
            default_tier=runtime.settings.default_tier, force=True,
        )  # fmt: skip
    return {"authorization": f"Bearer {gw.scan.add(created.key)}"}


async def upload_version(gw: Gateway, admin: dict[str, str], tenant_id: str, seed: int) -> Any:
    files = demo_adapter_files(gw.state.settings.base_model, seed=seed)
    r = await gw.client.post(
        f"/admin/v1/tenants/{tenant_id}/adapters", headers=admin, data={"name": "support"},
        files=[("files", (f.filename, f.data)) for f in files],
    )  # fmt: skip
    assert r.status_code == 201, r.text
    return r.json()


async def complete(gw: Gateway, headers: dict[str, str], model: str, **body: Any) -> Any:
    r = await gw.client.post(
        "/v1/completions", headers=headers,
        json={"model": model, "prompt": "Versions", "max_tokens": 1, "temperature": 0, **body},
    )  # fmt: skip
    return r


async def switch_under_load(
    gw: Gateway, admin: dict[str, str], tenant: TenantKey, alias: str, number: dict[str, int]
) -> None:
    """The alias (at version 1) switched to version 2 with 200 requests in flight: each is
    served wholly by one version (both of its prompts), the one its usage row records; both
    versions served; requests after the switch get version 2."""
    # 200 requests (two prompts each: two engine requests) in flight while the alias switches:
    # the first half admitted before it (held before the engine until all 200 are in), the
    # second half sent while the switch is under way and after
    log = AdapterLog(gw.state.engine)
    gw.state.engine = gw.state.lifecycle.engine = log
    lifecycle = gw.state.lifecycle
    body = {"prompt": ["Versions under load", "and a second prompt"], "max_tokens": 2}

    async def later(delay_s: float) -> Any:
        await asyncio.sleep(delay_s)
        return await complete(gw, tenant.headers, "support", **body)

    async def until_in_flight(num: int) -> None:
        deadline = asyncio.get_running_loop().time() + 60
        while lifecycle.num_in_flight < num:
            assert asyncio.get_running_loop().time() < deadline, lifecycle.num_in_flight
            await asyncio.sleep(0.002)

    log.gate.clear()
    try:
        half = NUM_IN_FLIGHT // 2
        tasks = [asyncio.create_task(later(0)) for _ in range(half)]
        await until_in_flight(half)
        switch = asyncio.create_task(gw.client.put(alias, headers=admin, json={"version": 2}))
        tasks += [asyncio.create_task(later(i * 0.001)) for i in range(half // 2)]
        assert (await switch).status_code == 200
        tasks += [asyncio.create_task(later(0)) for _ in range(half - half // 2)]
        await until_in_flight(NUM_IN_FLIGHT)  # all 200 admitted, none answered yet
        log.gate.set()
        answers = await asyncio.gather(*tasks)
    finally:
        log.gate.set()
        gw.stop_recording(log)
    assert [a.status_code for a in answers] == [200] * NUM_IN_FLIGHT
    assert {a.json()["model"] for a in answers} == {"support"}
    rows = [r for r in await gw.usage_records(tenant) if r.model == "support"]
    assert len(rows) == NUM_IN_FLIGHT
    served_by: dict[str, set[str | None]] = {}
    for engine_request_id, engine_name in log.served:
        served_by.setdefault(engine_request_id.rsplit("-", 1)[0], set()).add(engine_name)
    for row in rows:
        assert served_by[row.request_id] == {row.adapter_id}  # both prompts, one version
        assert row.adapter_version == number[row.adapter_id]
    by_version = Counter(row.adapter_version for row in rows)
    assert by_version[1] > 0 and by_version[2] > 0, by_version  # the switch came mid-load
    assert (await complete(gw, tenant.headers, "support")).json()["model"] == "support"
    rows = await gw.usage_records(tenant)
    assert max(rows, key=lambda r: r.started_at).adapter_version == 2

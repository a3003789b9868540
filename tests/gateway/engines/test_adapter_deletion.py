"""Deleting an adapter, or its tenant, through the admin API unloads it from the engine that
holds it (issue 10: it used to stay loaded and keep serving from memory after its files were
gone), and its bytes are gone from the store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gateway_harness import ADMIN_CTX, Gateway

from gateway.demo.adapters import demo_adapter_files
from tenancy.auth.bootstrap import bootstrap_admin
from tenancy.crud.adapters import register_adapter
from tenancy.sql.models import AdapterBlob

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _admin_key(gw: Gateway) -> str:
    runtime = gw.state.tenancy
    async with runtime.sessionmaker() as session:
        created = await bootstrap_admin(
            session, minter=runtime.minter, tiers=runtime.tier_names,
            default_tier=runtime.settings.default_tier, force=True,
        )  # fmt: skip
    return gw.scan.add(created.key)


async def _adapter(gw: Gateway, tenant_id: str, name: str, seed: int) -> Any:
    async with gw.state.tenancy.sessionmaker() as session:
        return await register_adapter(
            session, ctx=ADMIN_CTX, service=gw.state.tenancy.adapters, tenant_id=tenant_id,
            name=name, uploads=demo_adapter_files(gw.state.settings.base_model, seed=seed),
        )  # fmt: skip


async def _held(gw: Gateway, adapter_id: str) -> bool:
    engine = gw.state.engine.engine  # type: ignore[attr-defined]
    return bool(await engine.run_in_loop(lambda e: e.lora.registry.get(adapter_id) is not None))


async def _stored(gw: Gateway, sha256: str) -> bool:
    async with gw.state.tenancy.sessionmaker() as session:
        return await session.get(AdapterBlob, sha256) is not None


async def _until_unloaded(gw: Gateway, adapter_id: str) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while await _held(gw, adapter_id):
        assert asyncio.get_running_loop().time() < deadline, "still loaded"
        await asyncio.sleep(0.05)


async def _use(gw: Gateway, key: Any, model: str) -> int:
    body = gw.chat_body("Use the adapter.", model=model, max_tokens=2)
    r = await gw.client.post("/v1/chat/completions", headers=key.headers, json=body)
    return r.status_code


async def test_deleting_an_adapter_or_its_tenant_unloads_it(gateway: Gateway) -> None:
    admin = {"authorization": f"Bearer {await _admin_key(gateway)}"}
    tenant = await gateway.tenant()
    first = await _adapter(gateway, tenant.tenant_id, "first", seed=11)
    second = await _adapter(gateway, tenant.tenant_id, "second", seed=12)
    for row in (first, second):
        assert await _use(gateway, tenant, row.name) == 200
        assert await _held(gateway, row.id)

    r = await gateway.client.delete(
        f"/admin/v1/tenants/{tenant.tenant_id}/adapters/{first.id}", headers=admin
    )
    assert r.status_code == 204, r.text
    await _until_unloaded(gateway, first.id)
    assert not await _stored(gateway, first.sha256)  # its blob went with its only version
    assert await _use(gateway, tenant, "first") == 404
    assert await _held(gateway, second.id)  # the other one stays

    r = await gateway.client.delete(f"/admin/v1/tenants/{tenant.tenant_id}", headers=admin)
    assert r.status_code == 204, r.text
    await _until_unloaded(gateway, second.id)
    assert not await _stored(gateway, second.sha256)

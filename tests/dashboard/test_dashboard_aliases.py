"""The adapters page shows each version and each alias; the alias's form switches it (issue 44,
item 2): with this session's CSRF token only, audited as `alias.switch`, served at once; a
tenant-admin switches no other tenant's alias (404, nothing changed)."""

from __future__ import annotations

import httpx
import pytest
from gateway_harness import ADMIN_CTX, Gateway, TenantKey
from pages import csrf_of, login
from sqlalchemy import select

from gateway.demo.adapters import demo_adapter_files
from tenancy.auth.scopes import Scope
from tenancy.crud.adapters import register_adapter
from tenancy.sql.models import AdapterAlias, AuditEvent

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _versions(gateway: Gateway, tenant: TenantKey, name: str, num: int) -> list[str]:
    ids = []
    for seed in range(num):
        async with gateway.state.tenancy.sessionmaker() as session:
            row = await register_adapter(
                session, ctx=ADMIN_CTX, service=gateway.state.tenancy.adapters,
                tenant_id=tenant.tenant_id, name=name,
                uploads=demo_adapter_files(gateway.state.settings.base_model, seed=seed),
            )  # fmt: skip
            ids.append(row.id)
    return ids


async def _alias_version(gateway: Gateway, tenant: TenantKey, name: str) -> str:
    async with gateway.state.tenancy.sessionmaker() as session:
        alias = (
            await session.scalars(
                select(AdapterAlias).where(
                    AdapterAlias.owner_tenant_id == tenant.tenant_id, AdapterAlias.name == name
                )
            )
        ).one()
        return alias.version_id


async def test_the_alias_form_switches_versions(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    mine = await gateway.tenant(scopes=(Scope.TENANT_ADMIN, Scope.INFERENCE))
    theirs = await gateway.tenant(scopes=(Scope.TENANT_ADMIN, Scope.INFERENCE))
    ids = await _versions(gateway, mine, "support", 2)
    their_ids = await _versions(gateway, theirs, "support", 2)
    await login(browser, mine.key)
    page = await browser.get(f"/dashboard/tenants/{mine.tenant_id}/adapters")
    assert page.status_code == 200
    assert 'data-alias="support"' in page.text and 'data-label="Version">2<' in page.text
    token = csrf_of(page.text)
    path = f"/dashboard/tenants/{mine.tenant_id}/adapter-aliases/support"
    assert path in page.text

    for bad in (None, "x" * 43):  # no token, a wrong one: refused, nothing switched
        data = {"version": "1"} if bad is None else {"version": "1", "csrf_token": bad}
        assert (await browser.post(path, data=data)).status_code == 403
    assert await _alias_version(gateway, mine, "support") == ids[1]

    r = await browser.post(path, data={"version": "1", "csrf_token": token})
    assert r.status_code == 303 and "done=alias-switched" in r.headers["location"]
    assert await _alias_version(gateway, mine, "support") == ids[0]
    body = gateway.chat_body("Which version?", model="support", max_tokens=1)
    await gateway.client.post("/v1/chat/completions", headers=mine.headers, json=body)
    rows = [r for r in await gateway.usage_records(mine) if r.model == "support"]
    assert [(r.adapter_id, r.adapter_version) for r in rows] == [(ids[0], 1)]  # at once
    async with gateway.state.tenancy.sessionmaker() as session:
        events = (
            await session.scalars(
                select(AuditEvent)
                .where(AuditEvent.tenant_id == mine.tenant_id, AuditEvent.action == "alias.switch")
                .order_by(AuditEvent.created_at)
            )
        ).all()
    switches = [(e.before["version_id"], e.after["version_id"]) for e in events]
    assert switches == [(ids[0], ids[1]), (ids[1], ids[0])]  # the second upload's, the form's

    r = await browser.post(path, data={"version": "7", "csrf_token": token})
    assert r.status_code == 404 and "Adapter version not found" in r.text
    other = f"/dashboard/tenants/{theirs.tenant_id}/adapter-aliases/support"
    assert (
        await browser.post(other, data={"version": "1", "csrf_token": token})
    ).status_code == 404
    assert await _alias_version(gateway, theirs, "support") == their_ids[1]

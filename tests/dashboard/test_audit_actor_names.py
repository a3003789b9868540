"""Issue 45, rough edge: the tenant page's audit table showed actors as `key:<uuid>`; it shows the
key's name, with the raw actor kept on the cell (`data-actor`, and its title on hover)."""

from __future__ import annotations

import httpx
import pytest
from gateway_harness import Gateway
from pages import login

from tenancy.auth.scopes import Scope

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_audit_table_names_the_key(gateway: Gateway, browser: httpx.AsyncClient) -> None:
    ta = await gateway.tenant(scopes=(Scope.TENANT_ADMIN, Scope.INFERENCE))
    key_id = (await gateway.state.tenancy.keys.verify(ta.key)).key_id
    r = await gateway.client.post(
        f"/admin/v1/tenants/{ta.tenant_id}/keys", headers=ta.headers, json={"name": "made-by-k"}
    )
    assert r.status_code == 201, r.text
    gateway.scan.add(r.json()["key"])

    await login(browser, ta.key)
    page = (await browser.get(f"/dashboard/tenants/{ta.tenant_id}")).text
    # The harness names every tenant's first key "k".
    assert f'data-actor="key:{key_id}" title="key:{key_id}">k</td>' in page
    assert f">key:{key_id}<" not in page

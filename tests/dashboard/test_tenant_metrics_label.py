"""Issue 45, rough edge: the `tenant` label of a tenant's series on /metrics is shown in the
admin API's tenant answer and on the dashboard's tenant page, so Grafana panels (which only
know the label) can be mapped to tenant names."""

from __future__ import annotations

import re

import httpx
import pytest
from gateway_harness import MODEL, Gateway
from pages import login

from tenancy.auth.scopes import Scope

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERIES = re.compile(r"^loragate_gateway_requests_total\{(.*)\} ", re.MULTILINE)


async def _tenant_labels(gateway: Gateway) -> set[str]:
    text = (await gateway.client.get("/metrics")).text
    return {m for labels in SERIES.findall(text) for m in re.findall(r'tenant="([^"]+)"', labels)}


async def test_the_label_shown_is_the_one_its_requests_carry(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    admin = await gateway.tenant(scopes=(Scope.ADMIN,))
    tenant = await gateway.tenant(scopes=(Scope.TENANT_ADMIN, Scope.INFERENCE))
    before = await _tenant_labels(gateway)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = await gateway.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
    assert r.status_code == 200, r.text
    new = await _tenant_labels(gateway) - before
    assert len(new) == 1  # the series its request started
    (label,) = new

    one = await gateway.client.get(f"/admin/v1/tenants/{tenant.tenant_id}", headers=admin.headers)
    assert one.status_code == 200 and one.json()["metrics_label"] == label
    every = await gateway.client.get("/admin/v1/tenants", headers=admin.headers)
    by_id = {t["id"]: t["metrics_label"] for t in every.json()}
    assert by_id[tenant.tenant_id] == label

    await login(browser, tenant.key)
    page = await browser.get(f"/dashboard/tenants/{tenant.tenant_id}")
    assert page.status_code == 200
    assert f'<code id="metrics-label">{label}</code>' in page.text

"""The webhook admin API (issue 45, item 3): the secret is shown once and never again (not in a
read, the audit log or a log line), a tenant admin reaches its own tenant's webhook and no
other's, each change is audited, bad thresholds, events and URLs are a 400 naming the field."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest_asyncio
from admin_harness import Harness, admin_harness
from tenancy_factories import SecretRegistry

from tenancy.settings import TenancySettings

HOOK = "http://127.0.0.1:9/hooks"


@pytest_asyncio.fixture
async def h(
    make_settings: Callable[..., TenancySettings], secret_registry: SecretRegistry
) -> AsyncIterator[Harness]:
    async with admin_harness(make_settings(alerts={"allow_private_urls": True})) as harness:
        secret_registry.add(harness.admin_key)
        yield harness


async def _tenant(h: Harness) -> str:
    r = await h.call("POST", "/tenants", json={"name": f"t-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def _key(h: Harness, tenant_id: str, scopes: list[str], reg: SecretRegistry) -> str:
    r = await h.call("POST", f"/tenants/{tenant_id}/keys", json={"name": "k", "scopes": scopes})
    assert r.status_code == 201, r.text
    return reg.add(str(r.json()["key"]))


async def test_create_read_update_rotate_delete_and_audit(
    h: Harness, secret_registry: SecretRegistry
) -> None:
    tid = await _tenant(h)
    path = f"/tenants/{tid}/webhook"
    r = await h.call("POST", path, json={"url": HOOK})
    assert r.status_code == 201, r.text
    assert r.headers["cache-control"] == "no-store"
    created = r.json()
    secret = secret_registry.add(created["secret"])
    assert secret.startswith("whsec_") and len(secret) > 40
    assert created["thresholds"] == [50, 80, 100] and created["events"] == ["budget.threshold"]
    assert (await h.call("POST", path, json={"url": HOOK})).status_code == 409
    read = (await h.call("GET", path)).json()
    assert "secret" not in read and read["id"] == created["id"] and read["url"] == HOOK
    events = ["outage.engine", "budget.threshold"]
    r = await h.call("PATCH", path, json={"thresholds": [90, 25, 90], "events": events})
    assert r.status_code == 200, r.text
    assert r.json()["thresholds"] == [25, 90] and r.json()["events"] == sorted(events)
    r = await h.call("POST", path + "/rotate-secret")
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    rotated = secret_registry.add(r.json()["secret"])
    assert rotated != secret
    r = await h.call("POST", path + "/test")
    assert r.status_code == 202
    [delivery] = (await h.call("GET", path + "/deliveries")).json()
    assert delivery["id"] == r.json()["delivery_id"] and delivery["status"] == "pending"
    assert delivery["payload"]["type"] == "webhook.test" and delivery["attempts"] == []
    assert (await h.call("DELETE", path)).status_code == 204
    assert (await h.call("GET", path)).status_code == 404
    audit = (await h.call("GET", f"/audit?tenant_id={tid}")).json()
    actions = [e["action"] for e in audit if e["action"].startswith("webhook.")]
    assert sorted(actions) == sorted(
        [
            "webhook.create",
            "webhook.update",
            "webhook.rotate_secret",
            "webhook.test",
            "webhook.delete",
        ]
    )
    text = json.dumps(audit)
    assert secret not in text and rotated not in text and "secret_sealed" not in text
    update = next(e for e in audit if e["action"] == "webhook.update")
    assert update["before"]["thresholds"] == [50, 80, 100]
    assert update["after"]["thresholds"] == [25, 90]


async def test_a_tenant_admin_reaches_its_own_webhook_only(
    h: Harness, secret_registry: SecretRegistry
) -> None:
    a, b = await _tenant(h), await _tenant(h)
    admin_a = await _key(h, a, ["tenant-admin"], secret_registry)
    inference_a = await _key(h, a, ["inference"], secret_registry)
    r = await h.call("POST", f"/tenants/{a}/webhook", admin_a, json={"url": HOOK})
    assert r.status_code == 201, r.text
    secret_registry.add(r.json()["secret"])
    r = await h.call("POST", f"/tenants/{b}/webhook", json={"url": HOOK})
    secret_registry.add(r.json()["secret"])
    for method, suffix in [
        ("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/rotate-secret"),
        ("POST", "/test"), ("GET", "/deliveries"),
    ]:  # fmt: skip
        kw: dict[str, Any] = {"json": {"enabled": False}} if method == "PATCH" else {}
        r = await h.call(method, f"/tenants/{b}/webhook{suffix}", admin_a, **kw)
        assert r.status_code == 404, (method, suffix, r.text)  # another tenant: not found
        r = await h.call(method, f"/tenants/{a}/webhook{suffix}", inference_a, **kw)
        assert r.status_code in (401, 403), (method, suffix)
    assert (await h.call("GET", f"/tenants/{a}/webhook", admin_a)).status_code == 200
    assert (await h.call("GET", f"/tenants/{b}/webhook")).json()["enabled"] is True


async def test_bad_values_are_a_400_naming_the_field(h: Harness) -> None:
    tid = await _tenant(h)
    path = f"/tenants/{tid}/webhook"
    for body, param in [
        ({"url": HOOK, "thresholds": [0]}, "thresholds"),
        ({"url": HOOK, "thresholds": [101]}, "thresholds"),
        ({"url": HOOK, "thresholds": []}, "thresholds"),
        ({"url": HOOK, "thresholds": list(range(1, 13))}, "thresholds"),
        ({"url": HOOK, "events": ["budget.everything"]}, "events"),
        ({"url": HOOK, "events": []}, "events"),
        ({"url": "ftp://127.0.0.1/x"}, "url"),
        ({"url": HOOK, "secret": "mine"}, "secret"),
    ]:
        r = await h.call("POST", path, json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.json())
    assert (await h.call("GET", path)).status_code == 404  # nothing was created


async def test_private_urls_are_refused_without_the_setting(
    make_settings: Callable[..., TenancySettings], secret_registry: SecretRegistry
) -> None:
    async with admin_harness(make_settings()) as h:
        secret_registry.add(h.admin_key)
        tid = await _tenant(h)
        for url in (HOOK, "http://169.254.169.254/latest/meta-data/", "http://[::1]/x"):
            r = await h.call("POST", f"/tenants/{tid}/webhook", json={"url": url})
            assert r.status_code == 400 and r.json()["error"]["param"] == "url", r.text
            assert url not in r.json()["error"]["message"]  # the reason, not the URL back
        r = await h.call("POST", f"/tenants/{tid}/webhook", json={"url": "https://93.184.216.34/h"})
        assert r.status_code == 201, r.text
        secret_registry.add(r.json()["secret"])
        r = await h.call("PATCH", f"/tenants/{tid}/webhook", json={"url": HOOK})
        assert r.status_code == 400 and r.json()["error"]["param"] == "url"

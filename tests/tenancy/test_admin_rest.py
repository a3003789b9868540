"""Acceptance 4 and 6: admin REST CRUD, tenant isolation (404), scopes, audit of every mutation."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from admin_harness import Harness
from tenancy_factories import SecretRegistry

from tenancy.crud.usage import UsageIn, record_usage
from tenancy.ids import RequestId, TenantId

UNAUTHORIZED = {
    "error": {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


async def _tenant(h: Harness, name: str | None = None) -> dict[str, Any]:
    r = await h.call("POST", "/tenants", json={"name": name or f"t-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201, r.text
    return dict(r.json())


async def _key(h: Harness, tenant_id: str, scopes: list[str], by: str | None = None) -> str:
    r = await h.call("POST", f"/tenants/{tenant_id}/keys", by, json={"name": "k", "scopes": scopes})
    assert r.status_code == 201, r.text
    assert r.headers["cache-control"] == "no-store"
    return str(r.json()["key"])


async def test_tenant_crud(h: Harness) -> None:
    t = await _tenant(h, "acme")
    assert t["tier"] == "standard" and t["status"] == "active"
    assert (await h.call("POST", "/tenants", json={"name": "acme"})).status_code == 409
    bad = await h.call("POST", "/tenants", json={"name": "x", "tier": "gold"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tier"
    bad = await h.call("POST", "/tenants", json={"name": "../etc"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "name"
    names = {x["name"] for x in (await h.call("GET", "/tenants")).json()}
    assert names == {"operator", "acme"}
    r = await h.call("PATCH", f"/tenants/{t['id']}", json={"tier": "realtime"})
    assert r.status_code == 200 and r.json()["tier"] == "realtime"
    r = await h.call("POST", f"/tenants/{t['id']}/salt/rotate")
    assert r.json()["salt_epoch"] == 1
    assert (await h.call("GET", f"/tenants/{t['id']}")).json()["name"] == "acme"
    assert (await h.call("DELETE", f"/tenants/{t['id']}")).status_code == 204
    assert (await h.call("GET", f"/tenants/{t['id']}")).status_code == 404


async def test_keys_quotas_usage(h: Harness, secret_registry: SecretRegistry) -> None:
    t = await _tenant(h)
    key = secret_registry.add(await _key(h, t["id"], ["inference"]))
    listed = (await h.call("GET", f"/tenants/{t['id']}/keys")).json()
    assert len(listed) == 1 and "key" not in listed[0] and key not in str(listed)
    assert listed[0]["last_four"] == key[-4:]
    kid = listed[0]["id"]
    r = await h.call("POST", f"/tenants/{t['id']}/keys/{kid}/rotate", json={"grace_seconds": 60})
    assert r.status_code == 200 and r.json()["key"] != key
    secret_registry.add(r.json()["key"])
    r = await h.call("POST", f"/tenants/{t['id']}/keys/{kid}/revoke")
    assert r.status_code == 200 and r.json()["revoked_at"]
    limits = {"requests_per_minute": 60, "tokens_per_minute": 10_000, "daily_token_budget": 10**6}
    r = await h.call("PUT", f"/tenants/{t['id']}/quotas", json=limits)
    assert r.status_code == 200 and r.json()["requests_per_minute"] == 60
    r = await h.call("GET", f"/tenants/{t['id']}/quotas")
    assert r.json()["tokens_per_minute"] == 10_000 and r.json()["max_concurrent"] is None
    r = await h.call("PUT", f"/tenants/{t['id']}/keys/{kid}/quotas", json={"max_concurrent": 2})
    assert r.status_code == 200
    assert (await h.call("GET", f"/tenants/{t['id']}/keys/{kid}/quotas")).json()[
        "max_concurrent"
    ] == 2
    now = dt.datetime.now(dt.UTC)
    async with h.runtime.sessionmaker() as session:
        for i, model in enumerate(["base", "base", "my-adapter"]):
            record = UsageIn(
                request_id=RequestId(f"req-{i}"), tenant_id=TenantId(t["id"]), api_key_id=None,
                model=model, adapter_id=None, prompt_tokens=10, completion_tokens=5,
                cached_tokens=2, finish_reason="stop", started_at=now, finished_at=now,
            )  # fmt: skip
            assert await record_usage(session, record=record)
        assert not await record_usage(session, record=record)  # idempotent per request id
    rows = (await h.call("GET", f"/tenants/{t['id']}/usage")).json()
    assert [(r["model"], r["num_requests"], r["prompt_tokens"]) for r in rows] == [
        ("base", 2, 20),
        ("my-adapter", 1, 10),
    ]


@pytest.mark.parametrize(
    "header",
    [
        "Bearer ' OR '1'='1",
        "Bearer lg_' UNION SELECT key_hash FROM api_keys --",
        "Bearer " + "a" * 10_000,
        "Bearer lg_ключ",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        None,
    ],
)
async def test_bad_credentials_get_a_constant_401(h: Harness, header: str | None) -> None:
    headers: dict[str, Any] = {} if header is None else {"authorization": header.encode()}
    r = await h.client.get("/admin/v1/tenants", headers=headers)
    assert r.status_code == 401 and r.json() == UNAUTHORIZED
    r = await h.client.get("/admin/v1/tenants", headers={**headers, "host": "x/health?"})
    assert r.status_code == 401


async def test_revoked_key_is_refused(h: Harness, secret_registry: SecretRegistry) -> None:
    t = await _tenant(h)
    ta = secret_registry.add(await _key(h, t["id"], ["tenant-admin"]))
    assert (await h.call("GET", "/tenants", ta)).status_code == 200
    kid = (await h.call("GET", f"/tenants/{t['id']}/keys")).json()[0]["id"]
    await h.call("POST", f"/tenants/{t['id']}/keys/{kid}/revoke")
    r = await h.call("GET", "/tenants", ta)
    assert r.status_code == 401 and r.json() == UNAUTHORIZED


async def test_tenant_a_cannot_see_or_change_tenant_b(
    h: Harness, secret_registry: SecretRegistry
) -> None:
    a, b = await _tenant(h), await _tenant(h)
    ka = secret_registry.add(await _key(h, a["id"], ["tenant-admin"]))
    inference = secret_registry.add(await _key(h, a["id"], ["inference"]))
    await _key(h, b["id"], ["inference"])
    listed = (await h.call("GET", "/tenants", ka)).json()
    assert [x["id"] for x in listed] == [a["id"]]
    bid = b["id"]
    b_kid = (await h.call("GET", f"/tenants/{bid}/keys")).json()[0]["id"]
    attempts = [
        ("GET", f"/tenants/{bid}", None),
        ("PATCH", f"/tenants/{bid}", {"tier": "batch"}),
        ("DELETE", f"/tenants/{bid}", None),
        ("GET", f"/tenants/{bid}/keys", None),
        ("POST", f"/tenants/{bid}/keys", {"name": "x", "scopes": ["inference"]}),
        ("POST", f"/tenants/{bid}/keys/{b_kid}/revoke", None),
        ("POST", f"/tenants/{bid}/keys/{b_kid}/rotate", {}),
        ("GET", f"/tenants/{bid}/quotas", None),
        ("PUT", f"/tenants/{bid}/quotas", {"requests_per_minute": 1}),
        ("GET", f"/tenants/{bid}/usage", None),
        ("GET", f"/tenants/{bid}/adapters", None),
        ("POST", f"/tenants/{bid}/salt/rotate", None),
        ("GET", f"/tenants/{a['id']}/keys/{b_kid}/quotas", None),
    ]
    for method, path, body in attempts:
        r = await h.call(method, path, ka, json=body)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert (await h.call("GET", f"/audit?tenant_id={bid}", ka)).json() == []
    own = (await h.call("GET", "/audit", ka)).json()
    assert own and all(e["tenant_id"] == a["id"] for e in own)
    # B is untouched
    assert (await h.call("GET", f"/tenants/{bid}")).json()["tier"] == "standard"
    # An inference key has no admin scope at all: 403.
    r = await h.call("GET", "/tenants", inference)
    assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
    # A tenant-admin may not widen its own scope, nor set tenant-level quotas.
    r = await h.call(
        "POST", f"/tenants/{a['id']}/keys", ka, json={"name": "x", "scopes": ["admin"]}
    )
    assert r.status_code == 403
    r = await h.call("PUT", f"/tenants/{a['id']}/quotas", ka, json={"requests_per_minute": 10**6})
    assert r.status_code == 403


async def test_key_quota_cannot_exceed_tenant_quota(
    h: Harness, secret_registry: SecretRegistry
) -> None:
    a = await _tenant(h)
    ka = secret_registry.add(await _key(h, a["id"], ["tenant-admin"]))
    await h.call("PUT", f"/tenants/{a['id']}/quotas", json={"tokens_per_minute": 1000})
    kid = (await h.call("GET", f"/tenants/{a['id']}/keys")).json()[0]["id"]
    path = f"/tenants/{a['id']}/keys/{kid}/quotas"
    assert (await h.call("PUT", path, ka, json={"tokens_per_minute": 5000})).status_code == 403
    assert (await h.call("PUT", path, ka, json={})).status_code == 403  # unlimited is wider
    assert (await h.call("PUT", path, ka, json={"tokens_per_minute": 500})).status_code == 200


async def test_bad_bodies_are_400_in_openai_shape(h: Harness) -> None:
    r = await h.call("PUT", "/tenants/x/quotas", json={"requests_per_minute": -1})
    assert r.status_code == 400
    body = r.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["param"]
    r = await h.call("POST", "/tenants", json={"name": "a", "extra": 1})
    assert r.status_code == 400

"""Issue 44, item 3: quota policies for one served base model (`?model=NAME`) beside the
all-models ones: stored and read per model, an unknown model a 400 naming `model`, a
tenant-admin's key policy for a model never above its tenant's, the subjects an admission on a
model counts, audited with the model."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from admin_harness import Harness
from tenancy_factories import SecretRegistry

from tenancy.alerts.budgets import BudgetReading
from tenancy.alerts.events import budget_body
from tenancy.crud.quotas import subjects_for
from tenancy.quota.store import QuotaLimits, QuotaSubject
from tenancy.quota.subjects import key_id_of, model_of

# The harness serves one base model, TenancySettings' default; a '/' in it, as in org/model.
MODEL = "loragate/tiny"
Q = {"model": MODEL}


async def _tenant_and_key(h: Harness, scopes: list[str]) -> tuple[str, str, str]:
    r = await h.call("POST", "/tenants", json={"name": f"t-{uuid.uuid4().hex[:6]}"})
    tenant_id = r.json()["id"]
    r = await h.call("POST", f"/tenants/{tenant_id}/keys", json={"name": "k", "scopes": scopes})
    assert r.status_code == 201, r.text
    return tenant_id, r.json()["id"], r.json()["key"]


async def test_policies_per_model_beside_the_all_models_one(h: Harness) -> None:
    tenant_id, key_id, _ = await _tenant_and_key(h, ["inference"])
    t, k = f"/tenants/{tenant_id}/quotas", f"/tenants/{tenant_id}/keys/{key_id}/quotas"
    assert (await h.call("PUT", t, json={"requests_per_minute": 10})).status_code == 200
    r = await h.call("PUT", t, json={"requests_per_minute": 2}, params=Q)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == MODEL and r.json()["requests_per_minute"] == 2
    r = await h.call("PUT", k, json={"tokens_per_minute": 500}, params=Q)
    assert r.status_code == 200 and r.json()["api_key_id"] == key_id, r.text
    # each read returns its own row; the all-models ones are untouched
    r = await h.call("GET", t, params=Q)
    assert (r.json()["model"], r.json()["requests_per_minute"]) == (MODEL, 2)
    r = await h.call("GET", t)
    assert (r.json()["model"], r.json()["requests_per_minute"]) == (None, 10)
    assert (await h.call("GET", k, params=Q)).json()["tokens_per_minute"] == 500
    assert (await h.call("GET", k)).json()["tokens_per_minute"] is None  # no policy: unlimited
    # a second PUT replaces the model's row, never adds one
    r = await h.call("PUT", t, json={"requests_per_minute": 3}, params=Q)
    assert r.status_code == 200 and r.json()["requests_per_minute"] == 3
    listed = (await h.call("GET", f"/tenants/{tenant_id}/quota-policies")).json()
    assert [(p["api_key_id"], p["model"], p["requests_per_minute"]) for p in listed] == [
        (None, None, 10), (None, MODEL, 3), (key_id, MODEL, None),
    ]  # fmt: skip
    # the audit entry carries the model
    entries = (await h.call("GET", f"/audit?tenant_id={tenant_id}")).json()
    puts = [e for e in entries if e["action"] == "quota.put"]
    assert sorted(str(e["after"]["model"]) for e in puts) == ["None", MODEL, MODEL, MODEL]
    changed = next(e for e in puts if e["before"] is not None)
    assert changed["before"]["model"] == MODEL and changed["before"]["requests_per_minute"] == 2


async def test_an_unknown_model_is_a_400_naming_model(h: Harness) -> None:
    tenant_id, key_id, _ = await _tenant_and_key(h, ["inference"])
    paths = [f"/tenants/{tenant_id}/quotas", f"/tenants/{tenant_id}/keys/{key_id}/quotas"]
    for path in paths:
        for method, body in (("GET", None), ("PUT", {"requests_per_minute": 1})):
            r = await h.call(method, path, json=body, params={"model": "huge"})
            error = r.json()["error"]
            assert r.status_code == 400 and error["param"] == "model", r.text
            assert "'huge'" in error["message"] and repr(MODEL) in error["message"]
    # nothing was written
    assert (await h.call("GET", f"/tenants/{tenant_id}/quota-policies")).json() == []


async def test_a_tenant_admin_cannot_widen_a_key_s_model_policy(
    h: Harness, secret_registry: SecretRegistry
) -> None:
    tenant_id, key_id, admin_key = await _tenant_and_key(h, ["tenant-admin"])
    ka = secret_registry.add(admin_key)
    t, k = f"/tenants/{tenant_id}/quotas", f"/tenants/{tenant_id}/keys/{key_id}/quotas"

    async def put_as_tenant_admin(**limits: Any) -> int:
        return (await h.call("PUT", k, ka, json=limits, params=Q)).status_code

    # no model policy for the tenant: its all-models policy is the ceiling
    await h.call("PUT", t, json={"tokens_per_minute": 1000})
    assert await put_as_tenant_admin(tokens_per_minute=2000) == 403
    assert await put_as_tenant_admin() == 403  # unlimited is wider
    assert await put_as_tenant_admin(tokens_per_minute=1000) == 200
    # with one, the lower of the two, field by field
    await h.call("PUT", t, json={"tokens_per_minute": 500, "max_concurrent": 4}, params=Q)
    assert await put_as_tenant_admin(tokens_per_minute=800, max_concurrent=4) == 403
    assert await put_as_tenant_admin(tokens_per_minute=500, max_concurrent=5) == 403
    assert await put_as_tenant_admin(tokens_per_minute=500, max_concurrent=4) == 200
    # nor may it set the tenant's model policy; an admin sets a key's as it likes
    r = await h.call("PUT", t, ka, json={"tokens_per_minute": 10**6}, params=Q)
    assert r.status_code == 403
    r = await h.call("PUT", k, json={"tokens_per_minute": 10**6}, params=Q)
    assert r.status_code == 200
    r = await h.call("GET", k, ka, params=Q)
    assert r.status_code == 200 and r.json()["tokens_per_minute"] == 10**6


async def test_subjects_of_a_request_on_a_model(h: Harness) -> None:
    tenant_id, key_id, _ = await _tenant_and_key(h, ["inference"])
    t, k = f"/tenants/{tenant_id}/quotas", f"/tenants/{tenant_id}/keys/{key_id}/quotas"
    await h.call("PUT", t, json={"requests_per_minute": 2}, params=Q)

    async def subjects(model: str | None, key: str | None = key_id) -> list[QuotaSubject]:
        async with h.runtime.sessionmaker() as session:
            return await subjects_for(session, tenant_id=tenant_id, key_id=key, model=model)

    # no all-models policy: the tenant's subject comes first all the same (the Redis group)
    assert await subjects(MODEL) == [
        QuotaSubject(f"t:{tenant_id}", QuotaLimits()),
        QuotaSubject(f"t:{tenant_id}/m:{MODEL}", QuotaLimits(requests_per_minute=2)),
    ]
    assert (
        await subjects(None)
        == await subjects("other")
        == [QuotaSubject(f"t:{tenant_id}", QuotaLimits())]
    )
    await h.call("PUT", t, json={"requests_per_minute": 9})
    await h.call("PUT", k, json={"max_concurrent": 3})
    await h.call("PUT", k, json={"max_concurrent": 1}, params=Q)
    found = await subjects(MODEL)
    assert [(s.key, s.limits) for s in found] == [
        (f"t:{tenant_id}", QuotaLimits(requests_per_minute=9)),
        (f"k:{key_id}", QuotaLimits(max_concurrent=3)),
        (f"t:{tenant_id}/m:{MODEL}", QuotaLimits(requests_per_minute=2)),
        (f"k:{key_id}/m:{MODEL}", QuotaLimits(max_concurrent=1)),
    ]
    assert [s.key for s in await subjects(MODEL, key=None)] == [found[0].key, found[2].key]
    # each subject names its key and model back (the budget alert's api_key_id)
    assert [(key_id_of(s.key), model_of(s.key)) for s in found] == [
        (None, None), (key_id, None), (None, MODEL), (key_id, MODEL),
    ]  # fmt: skip
    reading = BudgetReading(found[3].key, "daily_token_budget", "tokens", "2026-12-02", 9, 10)
    body = budget_body(
        "e", tenant_id=tenant_id, reading=reading, threshold=80, exhausted=False,
        now=dt.datetime.now(dt.UTC),
    )  # fmt: skip
    assert f'"api_key_id":"{key_id}"' in body

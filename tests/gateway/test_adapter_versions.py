"""Issue 44, acceptance 2, through a real gateway (tiny model, in-process engine, SQLite): two
versions of one name; the alias switched while 200 requests are in flight, each served wholly
by one version and its usage row saying which; a 90/10 canary within 5 points over 1,000
requests; rollback; a version in use cannot be deleted. And: `name@N`; versions never share
engine names or cached prefixes; another tenant's names are a 404; another replica sees a
switch within its cache TTL."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest
from gateway_harness import Gateway
from version_checks import (
    AdapterLog,
    admin_headers,
    complete,
    switch_under_load,
    upload_version,
)

from gateway.demo.adapters import demo_adapter_files
from gateway.policy import PolicyService
from tenancy.ids import ApiKeyId, TenantId

pytestmark = pytest.mark.asyncio(loop_scope="module")

NUM_CANARY = 1_000


async def test_versions_aliases_and_canary_under_load(gateway: Gateway) -> None:
    gw = gateway
    admin = await admin_headers(gw)
    tenant = await gw.tenant()
    alias = f"/admin/v1/tenants/{tenant.tenant_id}/adapter-aliases/support"
    v1 = await upload_version(gw, admin, tenant.tenant_id, seed=21)
    v2 = await upload_version(gw, admin, tenant.tenant_id, seed=22)
    number = {v1["id"]: 1, v2["id"]: 2}
    r = await gw.client.put(alias, headers=admin, json={"version": 1})
    assert r.status_code == 200 and r.json()["version"] == 1

    await switch_under_load(gw, admin, tenant, alias, number)

    # deleting what the alias points at is refused, naming it
    r = await gw.client.delete(
        f"/admin/v1/tenants/{tenant.tenant_id}/adapters/{v2['id']}", headers=admin
    )
    assert r.status_code == 409 and "alias 'support'" in r.json()["error"]["message"]

    # a 90/10 canary over 1,000 requests, counted in the usage rows
    gw.state.policy.rng = random.Random(44)
    r = await gw.client.put(alias, headers=admin, json={"version": 1})
    r = await gw.client.put(alias + "/canary", headers=admin, json={"version": 2, "weight": 10})
    assert r.status_code == 200 and r.json()["canary_weight"] == 10, r.text
    r = await gw.client.delete(
        f"/admin/v1/tenants/{tenant.tenant_id}/adapters/{v2['id']}", headers=admin
    )
    assert r.status_code == 409 and "its canary" in r.json()["error"]["message"]
    before = {r.request_id for r in await gw.usage_records(tenant)}
    gate = asyncio.Semaphore(64)

    async def one() -> int:
        async with gate:
            return (await complete(gw, tenant.headers, "support")).status_code

    assert set(await asyncio.gather(*(one() for _ in range(NUM_CANARY)))) == {200}
    split = Counter(
        r.adapter_version for r in await gw.usage_records(tenant) if r.request_id not in before
    )
    assert sum(split.values()) == NUM_CANARY
    assert abs(split[2] / NUM_CANARY - 0.10) <= 0.05, split
    assert abs(split[1] / NUM_CANARY - 0.90) <= 0.05, split

    # rollback: the canary off, every request to version 1 again
    assert (await gw.client.delete(alias + "/canary", headers=admin)).status_code == 200
    before = {r.request_id for r in await gw.usage_records(tenant)}
    for _ in range(20):
        assert (await complete(gw, tenant.headers, "support")).status_code == 200
    after = [r for r in await gw.usage_records(tenant) if r.request_id not in before]
    assert {r.adapter_version for r in after} == {1}


async def test_name_at_version_engine_names_and_cached_prefixes(gateway: Gateway) -> None:
    gw = gateway
    admin = await admin_headers(gw)
    tenant, other = await gw.tenant(), await gw.tenant()
    v1 = await upload_version(gw, admin, tenant.tenant_id, seed=31)
    v2 = await upload_version(gw, admin, tenant.tenant_id, seed=32)
    log = AdapterLog(gw.state.engine)
    gw.state.engine = gw.state.lifecycle.engine = log
    try:
        long_prompt = " ".join(f"word{i}" for i in range(120))  # several full KV blocks
        cached = {}
        for model in ("support@1", "support@1", "support@2"):
            r = await complete(gw, tenant.headers, model, prompt=long_prompt)
            assert r.status_code == 200 and r.json()["model"] == model
            cached.setdefault(model, []).append(
                r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            )
    finally:
        gw.stop_recording(log)
    assert [name for _, name in log.served] == [v1["id"], v1["id"], v2["id"]]
    assert v1["id"] != v2["id"]
    # version 1's blocks served version 1 again, never version 2 (same tenant, same prompt)
    assert cached["support@1"][1] > 0 and cached["support@2"] == [0]
    rows = {r.model: r for r in await gw.usage_records(tenant)}
    assert (rows["support@2"].adapter_id, rows["support@2"].adapter_version) == (v2["id"], 2)

    for model in (
        "support@3",
        "support@",
        "support@x",
        "support@01",
        "support@0",
        "@1",
        "support@1@1",
    ):
        assert (await complete(gw, tenant.headers, model)).status_code == 404, model
    # another tenant names neither the alias nor a version of it
    for model in ("support", "support@1", "support@2"):
        assert (await complete(gw, other.headers, model)).status_code == 404, model
    listed = (await gw.client.get("/v1/models", headers=tenant.headers)).json()["data"]
    assert [m["id"] for m in listed].count("support") == 1
    assert not any("@" in m["id"] for m in listed)  # versions are not listed
    r = await gw.client.get("/v1/models/support@1", headers=tenant.headers)
    assert r.status_code == 200 and r.json()["id"] == "support@1"


async def test_another_replica_sees_a_switch_within_its_cache_ttl(gateway: Gateway) -> None:
    gw = gateway
    admin = await admin_headers(gw)
    tenant = await gw.tenant()
    await upload_version(gw, admin, tenant.tenant_id, seed=41)
    await upload_version(gw, admin, tenant.tenant_id, seed=42)
    ttl_s = 0.5
    replica = PolicyService(
        gw.state.tenancy, base_model=gw.state.policy.base_model, cache_ttl_s=ttl_s
    )
    ctx = await gw.state.policy.authenticate(tenant.headers["authorization"])
    assert ctx.tenant_id == TenantId(tenant.tenant_id) and ctx.key_id != ApiKeyId("")

    async def version() -> int:
        resolved = await replica.resolve(ctx, "support")
        assert resolved.adapter is not None
        return resolved.adapter.version

    assert await version() == 2
    alias = f"/admin/v1/tenants/{tenant.tenant_id}/adapter-aliases/support"
    assert (await gw.client.put(alias, headers=admin, json={"version": 1})).status_code == 200
    loop = asyncio.get_running_loop()
    switched_at = loop.time()
    while await version() != 1:
        await asyncio.sleep(0.02)
    assert loop.time() - switched_at <= ttl_s + 0.2


async def test_public_names_and_a_tenants_own_name_hiding_them(gateway: Gateway) -> None:
    gw = gateway
    admin = await admin_headers(gw)
    files = [
        ("files", (f.filename, f.data))
        for f in demo_adapter_files(gw.state.settings.base_model, seed=51)
    ]
    for activate in ("true", "false"):  # public versions 1 and 2; the alias stays on 1
        r = await gw.client.post(
            "/admin/v1/adapters", headers=admin, files=files,
            data={"name": "shared", "activate": activate},
        )  # fmt: skip
        assert r.status_code == 201, r.text
    public = {v["version"]: v["id"] for v in (
        await gw.client.get("/admin/v1/adapters?name=shared", headers=admin)).json()}  # fmt: skip
    reader, owner = await gw.tenant(), await gw.tenant()

    async def served(tenant: Any, model: str) -> str | None:
        ctx = await gw.state.policy.authenticate(tenant.headers["authorization"])
        resolved = await gw.state.policy.resolve(ctx, model)
        return resolved.adapter.adapter_id if resolved.adapter else None

    assert await served(reader, "shared") == public[1]
    assert await served(reader, "shared@2") == public[2]
    # a tenant's own name hides the public one, its versions too
    r = await gw.client.post(
        f"/admin/v1/tenants/{owner.tenant_id}/adapters", headers=admin, files=files,
        data={"name": "shared"},
    )  # fmt: skip
    own = r.json()["id"]
    assert await served(owner, "shared") == own and await served(owner, "shared@1") == own
    assert (await complete(gw, owner.headers, "shared@2")).status_code == 404
    # the admin switches the public alias; a tenant admin could not
    r = await gw.client.put("/admin/v1/adapter-aliases/shared", headers=admin, json={"version": 2})
    assert r.status_code == 200
    assert await served(reader, "shared") == public[2]
    assert await served(owner, "shared") == own

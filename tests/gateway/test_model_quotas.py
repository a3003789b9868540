"""Issue 44, item 3, through a real gateway serving tiny (the primary) and small: a quota policy
for small counts small's requests, its adapters' included, and no other model's; the all-models
policy still counts both. With the in-process and the Redis quota store."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from gateway_harness import Gateway, SecretScan, TenantKey, gateway_settings, running_gateway
from services import delete_redis_keys
from version_checks import admin_headers

from gateway.demo.adapters import demo_adapter_files

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

SMALL = "small"


@pytest_asyncio.fixture(
    scope="module",
    loop_scope="module",
    params=["inprocess", pytest.param("redis", marks=pytest.mark.redis)],
)
async def two_models(
    request: pytest.FixtureRequest,
    model_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
    secret_scan: SecretScan,
) -> AsyncIterator[Gateway]:
    extra: dict[str, Any] = {}
    if request.param == "redis":
        url = request.getfixturevalue("redis_server_url")
        prefix = f"lgtest:{uuid.uuid4().hex[:12]}:"
        extra = {"quota_store": "redis", "redis_url": url, "redis_key_prefix": prefix}
    settings = gateway_settings(
        model_factory(), tmp_path_factory.mktemp("model-quotas"),
        models=[{"name": SMALL, "path": str(model_factory(size="small"))}], **extra,
    )  # fmt: skip
    try:
        async with running_gateway(settings, secret_scan) as gw:
            yield gw
    finally:
        if extra:
            delete_redis_keys(extra["redis_url"], extra["redis_key_prefix"])


async def _generate(gw: Gateway, tenant: TenantKey, model: str) -> int:
    body = {"model": model, "token_ids": [5, 17, 99], "sampling_params": {"max_tokens": 1}}
    r = await gw.client.post("/inference/v1/generate", headers=tenant.headers, json=body)
    if r.status_code == 429:
        assert r.json()["error"]["code"] == "rate_limit_exceeded", r.text
    else:
        assert r.status_code == 200, (model, r.text)
    return r.status_code


async def _put(gw: Gateway, path: str, limits: dict[str, int], model: str | None = None) -> None:
    params = {"model": model} if model is not None else {}
    r = await gw.client.put(
        f"/admin/v1/tenants/{path}/quotas", headers=await admin_headers(gw), json=limits,
        params=params,
    )  # fmt: skip
    assert r.status_code == 200 and r.json()["model"] == model, r.text


async def _small_adapter(gw: Gateway, tenant: TenantKey) -> str:
    files = demo_adapter_files(gw.state.others[SMALL].base, seed=7)
    r = await gw.client.post(
        f"/admin/v1/tenants/{tenant.tenant_id}/adapters", headers=await admin_headers(gw),
        data={"name": "s-ad", "base_model": SMALL},
        files=[("files", (f.filename, f.data)) for f in files],
    )  # fmt: skip
    assert r.status_code == 201 and r.json()["base_model"] == SMALL, r.text
    return "s-ad"


@MODULE_LOOP
async def test_a_model_policy_counts_that_model_only(two_models: Gateway) -> None:
    gw = two_models
    tenant = await gw.tenant()
    adapter = await _small_adapter(gw, tenant)
    await _put(gw, tenant.tenant_id, {"requests_per_minute": 2}, model=SMALL)
    # small and its adapter share small's two requests a minute
    assert [await _generate(gw, tenant, m) for m in (SMALL, adapter)] == [200, 200]
    assert [await _generate(gw, tenant, m) for m in (SMALL, adapter)] == [429, 429]
    # the primary model is not counted there (nor limited: the tenant has no all-models policy)
    assert [await _generate(gw, tenant, "tiny") for _ in range(4)] == [200] * 4


@MODULE_LOOP
async def test_the_all_models_policy_counts_both(two_models: Gateway) -> None:
    gw = two_models
    tenant = await gw.tenant(requests_per_minute=4)
    await _put(gw, tenant.tenant_id, {"requests_per_minute": 2}, model=SMALL)
    assert [await _generate(gw, tenant, m) for m in (SMALL, SMALL, SMALL)] == [200, 200, 429]
    # small's two count in the tenant's four (the refused one never counted)
    assert [await _generate(gw, tenant, "tiny") for _ in range(3)] == [200, 200, 429]


@MODULE_LOOP
async def test_a_key_s_model_policy(two_models: Gateway) -> None:
    gw = two_models
    tenant = await gw.tenant()
    key_id = await _key_id(gw, tenant)
    await _put(gw, f"{tenant.tenant_id}/keys/{key_id}", {"requests_per_minute": 1}, model=SMALL)
    assert [await _generate(gw, tenant, m) for m in (SMALL, SMALL, "tiny")] == [200, 429, 200]


async def _key_id(gw: Gateway, tenant: TenantKey) -> str:
    r = await gw.client.get(
        f"/admin/v1/tenants/{tenant.tenant_id}/keys", headers=await admin_headers(gw)
    )
    return str(r.json()[0]["id"])

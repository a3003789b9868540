"""Issue 11, acceptance 6: the quota-state API's numbers equal the quota store's after a mix of
admitted, rejected and settled requests, in both stores (in-process and Redis), and its
rejections by reason are the 429s the clients got. Through the real app and engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from gateway_harness import Gateway, SecretScan, TenantKey, gateway_settings, running_gateway

from tenancy.auth.scopes import Scope
from tenancy.ids import RequestId
from tenancy.quota.store import QuotaLimits, QuotaSubject, QuotaUsage

RPM = 4
LIMITS = {"requests_per_minute": RPM, "tokens_per_minute": 100_000, "max_concurrent": 3,
          "daily_token_budget": 1_000_000, "monthly_token_budget": 5_000_000,
          "daily_spend_budget_micros": 2_000_000, "monthly_spend_budget_micros": 9_000_000,
          }  # fmt: skip


@pytest_asyncio.fixture(params=["inprocess", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tmp_path: Path,
    secret_scan: SecretScan,
) -> AsyncIterator[Gateway]:
    extra: dict[str, object] = {}
    if request.param == "redis":
        extra = {
            "quota_store": "redis",
            "redis_url": request.getfixturevalue("redis_server_url"),
            "redis_key_prefix": request.getfixturevalue("redis_prefix"),
        }
    settings = gateway_settings(tiny_model_dir, tmp_path, **extra)
    async with running_gateway(settings, secret_scan) as gateway:
        yield gateway


async def _admin(gw: Gateway) -> TenantKey:
    return await gw.tenant(scopes=(Scope.ADMIN,))


def _by_name(state: dict[str, object]) -> dict[str, dict[str, object]]:
    return {row["name"]: row for row in state["limits"]}  # type: ignore[index,union-attr]


async def _state(gw: Gateway, admin: TenantKey, path: str) -> dict[str, Any]:
    r = await gw.client.get(f"/admin/v1/tenants/{path}/quota-state", headers=admin.headers)
    assert r.status_code == 200, r.text
    state: dict[str, Any] = r.json()
    return state


def _assert_equals_store(state: dict[str, Any], usage: QuotaUsage, limits: dict[str, int]) -> None:
    used = {
        "requests_per_minute": usage.num_requests,
        "tokens_per_minute": usage.num_tokens,
        "max_concurrent": usage.num_leases,
        "daily_token_budget": usage.day_tokens,
        "monthly_token_budget": usage.month_tokens,
        "daily_spend_budget_micros": usage.day_spend_micros,
        "monthly_spend_budget_micros": usage.month_spend_micros,
    }
    rows = {row["name"]: row for row in state["limits"]}
    assert list(rows) == list(used)  # every limit, in reading order
    for name, row in rows.items():
        assert row["used"] == used[name], name
        assert row["limit"] == limits[name], name
        assert row["remaining"] == max(0, limits[name] - used[name]), name
    assert rows["max_concurrent"]["resets_in_s"] is None
    assert rows["requests_per_minute"]["resets_in_s"] > 0  # the window holds requests
    assert rows["requests_per_minute"]["resets_in_s"] <= 60


async def _ledger_tokens(gw: Gateway, tenant: TenantKey) -> int:
    return sum(r.prompt_tokens + r.completion_tokens for r in await gw.usage_records(tenant))


async def test_quota_state_equals_the_store(gw: Gateway) -> None:
    admin = await gw.tenant(scopes=(Scope.ADMIN,))
    tenant = await gw.tenant(**LIMITS)
    body = gw.chat_body("quota state: admitted, held, rejected", max_tokens=3)

    async def chat() -> int:
        r = await gw.client.post("/v1/chat/completions", json=body, headers=tenant.headers)
        return r.status_code

    assert [await chat(), await chat()] == [200, 200]  # admitted and settled
    # One admission still in flight (never settled yet): it holds a lease and its reservation.
    store = gw.state.tenancy.quotas
    held = await store.admit(
        request_id=RequestId(f"held-{tenant.tenant_id}"),
        subjects=[QuotaSubject(f"t:{tenant.tenant_id}", QuotaLimits())],
        reserve_tokens=50,
    )
    assert await chat() == 200
    assert [await chat(), await chat()] == [429, 429]  # the window holds RPM requests

    state = await _state(gw, admin, tenant.tenant_id)
    usage = await store.usage(f"t:{tenant.tenant_id}")
    _assert_equals_store(state, usage, LIMITS)
    assert usage.num_requests == RPM and usage.num_leases == 1
    assert usage.day_tokens == await _ledger_tokens(gw, tenant) + 50
    assert state["rejections_last_hour"] == {"rate_limit_exceeded": 2}
    assert state["subject"] == f"t:{tenant.tenant_id}" and state["has_own_policy"]

    await store.settle(held, used_tokens=7)
    state = await _state(gw, admin, tenant.tenant_id)
    usage = await store.usage(f"t:{tenant.tenant_id}")
    _assert_equals_store(state, usage, LIMITS)
    assert usage.num_leases == 0
    assert usage.day_tokens == await _ledger_tokens(gw, tenant) + 7


async def test_key_quota_state_and_scoping(gw: Gateway) -> None:
    admin = await gw.tenant(scopes=(Scope.ADMIN,))
    tenant = await gw.tenant(**LIMITS)
    other = await gw.tenant(scopes=(Scope.TENANT_ADMIN,))
    keys = (await gw.client.get(f"/admin/v1/tenants/{tenant.tenant_id}/keys",
                                headers=admin.headers)).json()  # fmt: skip
    key_id = keys[0]["id"]
    path = f"{tenant.tenant_id}/keys/{key_id}"
    unlimited = await _state(gw, admin, path)  # no policy of its own: no counters
    assert not unlimited["has_own_policy"]
    assert {row["limit"] for row in unlimited["limits"]} == {None}

    key_limits = {**LIMITS, "requests_per_minute": 2}
    r = await gw.client.put(f"/admin/v1/tenants/{path}/quotas", json=key_limits,
                            headers=admin.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    await asyncio.sleep(gw.state.settings.policy_cache_ttl_s)  # admission's policy cache
    body = gw.chat_body("quota state of one key", max_tokens=2)
    codes = [
        (
            await gw.client.post("/v1/chat/completions", json=body, headers=tenant.headers)
        ).status_code
        for _ in range(3)
    ]
    assert codes == [200, 200, 429]
    state = await _state(gw, admin, path)
    usage = await gw.state.tenancy.quotas.usage(f"k:{key_id}")
    _assert_equals_store(state, usage, key_limits)
    assert state["has_own_policy"] and state["rejections_last_hour"] == {"rate_limit_exceeded": 1}

    # A tenant-admin of another tenant: the same 404 as a tenant that does not exist.
    for target in (tenant.tenant_id, path, "no-such-tenant"):
        r = await gw.client.get(f"/admin/v1/tenants/{target}/quota-state", headers=other.headers)
        assert r.status_code == 404, target
        assert r.json()["error"]["code"] == "not_found"
    r = await gw.client.get(f"/admin/v1/tenants/{tenant.tenant_id}/quota-state",
                            headers=tenant.headers)  # fmt: skip
    assert r.status_code == 403  # an inference key on the admin API

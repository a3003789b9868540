"""Inputs that used to get a 500 or a misleading answer (issue 10): each is a clear 4xx now.

- `seed` outside the signed 64-bit range on chat and completions: 400 naming `seed` (the
  tokens-only route already said 400).
- A prompt token id outside the vocabulary: the message names its position in the list.
- A valid key of a suspended tenant: 403 `tenant_suspended`, not "Incorrect API key provided."
"""

from __future__ import annotations

import pytest
from gateway_harness import ADMIN_CTX, MODEL, Gateway

from tenancy.crud.tenants import update_tenant
from tenancy.schemas import TenantUpdate

pytestmark = pytest.mark.asyncio(loop_scope="module")

INT64 = 1 << 63


@pytest.mark.parametrize("seed", [INT64, -INT64 - 1, 10**30])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_a_seed_outside_int64_is_a_400_naming_seed(
    gateway: Gateway, route: str, seed: int
) -> None:
    tenant = await gateway.tenant()
    body = {"model": MODEL, "max_tokens": 2, "seed": seed}
    if route.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    r = await gateway.client.post(route, headers=tenant.headers, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "seed"
    ok = await gateway.client.post(route, headers=tenant.headers, json={**body, "seed": INT64 - 1})
    assert ok.status_code == 200, ok.text  # the edge of the range is fine


async def test_an_out_of_vocabulary_token_is_named_by_its_position(gateway: Gateway) -> None:
    tenant = await gateway.tenant()
    vocab = gateway.state.lifecycle.planner.vocab_size
    r = await gateway.client.post(
        "/v1/completions",
        headers=tenant.headers,
        json={"model": MODEL, "prompt": [5, 6, vocab + 7], "max_tokens": 2},
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "prompt"
    assert f"prompt[2] is {vocab + 7}" in error["message"]


async def test_a_suspended_tenant_is_told_so(gateway: Gateway) -> None:
    tenant = await gateway.tenant()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert (
        await gateway.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
    ).status_code == 200
    runtime = gateway.state.tenancy
    async with runtime.sessionmaker() as session:
        await update_tenant(
            session, ctx=ADMIN_CTX, tenant_id=tenant.tenant_id,
            data=TenantUpdate(status="suspended"), tiers=runtime.tier_names,
        )  # fmt: skip
    await runtime.keys.invalidate(tenant_id=tenant.tenant_id)  # as the admin route does
    r = await gateway.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["code"] == "tenant_suspended" and error["type"] == "permission_error"
    bad = await gateway.client.post(
        "/v1/chat/completions", headers={"authorization": "Bearer lg_nope"}, json=body
    )
    assert bad.status_code == 401  # a key that is not valid still gets the one constant 401

"""Issue 45, item 2 (acceptance): a currency budget refuses exactly at its bound across four
gateway processes sharing one Redis quota store and one PostgreSQL ledger.

Each request is priced without a cached discount and generates exactly `max_tokens`
(`ignore_eos`), so what settlement charges equals what admission reserved: a budget of N
requests' cost plus half of one admits exactly N of a burst spread over the four gateways, and
the ledger's spend is exactly N requests' cost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from deployment import deploy

MAX_TOKENS = 8
PRICE = {"model": "tiny", "prompt": "1500", "completion": "2500.25"}  # per 1M tokens
NUM_FIT = 5
BURST_PER_GATEWAY = 6


def _body() -> dict[str, object]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "What is my budget?"}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}  # fmt: skip


async def test_a_currency_budget_refuses_exactly_at_its_bound_across_four_gateways(
    tiny_model_dir: Path, workdir: Path, postgres_url: str, redis_server_url: str
) -> None:
    dep = deploy(tiny_model_dir, workdir, database_url=postgres_url, redis_url=redis_server_url,
                 num_gateways=4)  # fmt: skip
    try:
        r = dep.gateway.admin("PUT", "/prices", json=PRICE)
        assert r.status_code == 200, r.text
        probe = dep.tenant()
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(dep.gateway.base_url + "/chat/completions", json=_body(),
                                  headers={"authorization": f"Bearer {probe.key}"})  # fmt: skip
            assert r.status_code == 200, r.text
            num_prompt = r.json()["usage"]["prompt_tokens"]
            # micro-units per request, rounded up once (tenancy/spend/money.py)
            cost = -(-(num_prompt * 1_500_000_000 + MAX_TOKENS * 2_500_250_000) // 1_000_000)
            budget = NUM_FIT * cost + cost // 2
            tenant = dep.tenant(daily_spend_budget_micros=budget)
            headers = {"authorization": f"Bearer {tenant.key}"}
            burst = [
                client.post(gateway.base_url + "/chat/completions", json=_body(), headers=headers)
                for gateway in dep.gateways
                for _ in range(BURST_PER_GATEWAY)
            ]
            answers = await asyncio.gather(*burst)
        codes = [a.status_code for a in answers]
        assert codes.count(200) == NUM_FIT, codes
        refused = [a for a in answers if a.status_code != 200]
        assert {a.status_code for a in refused} == {429}
        for answer in refused:
            error = answer.json()["error"]
            assert error["code"] == "insufficient_quota", error
            assert "daily_spend_budget_micros" in error["message"]
            assert answer.headers["x-should-retry"] == "false"
        rows = await dep.wait_rows(tenant.tenant_id, NUM_FIT)
        assert len(rows) == NUM_FIT
        assert [r.cost_micros for r in rows] == [cost] * NUM_FIT
        usage = await dep.quota(tenant.tenant_id)
        assert usage.day_spend_micros == usage.month_spend_micros == NUM_FIT * cost <= budget
        spend = dep.gateway.admin("GET", f"/tenants/{tenant.tenant_id}/spend").json()
        assert spend["total"]["cost_micros"] == NUM_FIT * cost
        assert dep.noisy_logs() == []
    finally:
        dep.stop()

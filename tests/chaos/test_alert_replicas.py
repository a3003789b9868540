"""Issue 45, item 3: once per threshold across replicas. Two gateway processes share one
PostgreSQL database (the once-guard's unique constraint, the outbox) and one Redis quota store;
a burst of one tenant's requests, spread over both, crosses ten thresholds of its daily token
budget while both settle and evaluate; a real receiver gets each threshold's webhook exactly
once, signed, and the delivery log holds one delivered event per threshold."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
from deployment import deploy
from webhook_receiver import webhook_receiver

from tenancy.alerts import signing

THRESHOLDS = list(range(10, 101, 10))
ENV = {"LORAGATE_ALERTS__ALLOW_PRIVATE_URLS": "true", "LORAGATE_ALERTS__POLL_INTERVAL_S": "0.2",
       "LORAGATE_ALERTS__BACKOFF_S": "0.2"}  # fmt: skip


def _body() -> dict[str, object]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "How full is my budget?"}],
            "max_tokens": 4, "ignore_eos": True, "temperature": 0}  # fmt: skip


async def test_each_threshold_alerts_once_across_two_gateways(
    tiny_model_dir: Path, workdir: Path, postgres_url: str, redis_server_url: str
) -> None:
    dep = deploy(tiny_model_dir, workdir, database_url=postgres_url, redis_url=redis_server_url,
                 num_gateways=2, **ENV)  # fmt: skip
    try:
        probe = dep.tenant()
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(dep.gateway.base_url + "/chat/completions", json=_body(),
                                  headers={"authorization": f"Bearer {probe.key}"})  # fmt: skip
            assert r.status_code == 200, r.text
            budget = 10 * r.json()["usage"]["total_tokens"]
            tenant = dep.tenant(daily_token_budget=budget)
            with webhook_receiver() as receiver:
                hook = {"url": receiver.url, "thresholds": THRESHOLDS}
                r = dep.gateway.admin("POST", f"/tenants/{tenant.tenant_id}/webhook", json=hook)
                assert r.status_code == 201, r.text
                secret = r.json()["secret"]
                dep.gateway.secrets.append(secret)
                headers = {"authorization": f"Bearer {tenant.key}"}
                for _ in range(3):  # waves, so crossings land on both replicas in turn
                    burst = [
                        client.post(g.base_url + "/chat/completions", json=_body(), headers=headers)
                        for g in dep.gateways
                        for _ in range(3)
                    ]
                    codes = [a.status_code for a in await asyncio.gather(*burst)]
                    assert set(codes) <= {200, 429}, codes
                    await asyncio.sleep(0.3)
                usage = await dep.quota(tenant.tenant_id)
                reached = [t for t in THRESHOLDS if usage.day_tokens * 100 >= budget * t]
                expected = sorted({*reached, 100})  # 18 requests for 10: the budget refused some
                got = await receiver.wait_for(len(expected), timeout_s=30)
                await asyncio.sleep(1.5)  # a second alert for any threshold would arrive by now
                got = list(receiver.received)
        counts = Counter(g.event["threshold"] for g in got)
        assert sorted(counts) == expected and set(counts.values()) == {1}, counts
        for g in got:
            assert signing.verify(secret, body=g.body, timestamp=g.headers[signing.TIMESTAMP_HEADER],
                                  header=g.headers[signing.SIGNATURE_HEADER])  # fmt: skip
        log = dep.gateway.admin("GET", f"/tenants/{tenant.tenant_id}/webhook/deliveries").json()
        assert sorted(d["payload"]["threshold"] for d in log) == expected
        assert {d["status"] for d in log} == {"delivered"}
        assert dep.noisy_logs() == []
        assert all(g.leaked_secrets() == [] and secret not in g.log_text() for g in dep.gateways)
    finally:
        dep.stop()

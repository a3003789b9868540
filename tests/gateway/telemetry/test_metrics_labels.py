"""/metrics labels (issue 10): a tenant is a digest of its id, the same label the engine gives
it, never the id; each tenant has its own bound of model names, so one tenant's many adapters
cannot push another's models into `other`."""

from __future__ import annotations

import pytest
from gateway_harness import MODEL, Gateway
from prometheus_client import generate_latest

from engine.protocol import tenant_label
from gateway.telemetry.metrics import OTHER, GatewayMetrics

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_metrics_name_tenants_by_digest_only(gateway: Gateway) -> None:
    tenant = await gateway.tenant()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = await gateway.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
    assert r.status_code == 200
    text = (await gateway.client.get("/metrics")).text
    assert tenant.tenant_id not in text
    assert f'tenant="{tenant_label(tenant.tenant_id)}"' in text


def test_each_tenant_has_its_own_bound_of_model_names() -> None:
    metrics = GatewayMetrics(max_tenants=10, max_models=3)
    greedy = [metrics.labels("greedy", f"adapter-{i}")[1] for i in range(20)]
    assert greedy[:3] == ["adapter-0", "adapter-1", "adapter-2"]
    assert set(greedy[3:]) == {OTHER}
    assert metrics.labels("modest", "tiny") == (tenant_label("modest"), "tiny")
    assert metrics.labels("modest", "its-own-adapter")[1] == "its-own-adapter"
    for tenant in ("greedy", "modest"):
        metrics.requests.labels(*metrics.labels(tenant, "tiny")).inc()
    exported = generate_latest(metrics.registry).decode()
    assert "greedy" not in exported and "modest" not in exported

"""The usage ledger's writes and drops on /metrics (issue 11, Grafana): the counters are the
writer's own, after real requests, and a full backlog's drop is counted."""

from __future__ import annotations

import datetime as dt

import pytest
from gateway_harness import Gateway
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.lifecycle.bookkeeping import UsageWriter
from gateway.telemetry.metrics import GatewayMetrics
from tenancy.crud.usage import UsageIn
from tenancy.ids import RequestId, TenantId

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _values(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


async def test_written_counts_the_ledger(gateway: Gateway) -> None:
    tenant = await gateway.tenant()
    body = gateway.chat_body("usage ledger metrics", max_tokens=2)
    for _ in range(3):
        r = await gateway.client.post("/v1/chat/completions", json=body, headers=tenant.headers)
        assert r.status_code == 200
    await gateway.state.usage.flush()
    metrics = _values((await gateway.client.get("/metrics")).text)
    assert (
        metrics["loragate_gateway_usage_records_written_total"] == gateway.state.usage.num_written
    )
    assert gateway.state.usage.num_written >= 3
    assert metrics["loragate_gateway_usage_records_pending"] == 0
    assert metrics["loragate_gateway_usage_records_dropped_total"] == 0


def _record(i: int) -> UsageIn:
    now = dt.datetime.now(dt.UTC)
    return UsageIn(
        request_id=RequestId(f"r{i}"), tenant_id=TenantId("t"), api_key_id=None, model="m",
        adapter_id=None, prompt_tokens=1, completion_tokens=1, cached_tokens=0,
        finish_reason="stop", started_at=now, finished_at=now,
    )  # fmt: skip


async def test_a_full_backlog_counts_its_drops() -> None:
    # Never started, so nothing is written: the backlog fills as it would with the database down.
    writer = UsageWriter(None, flush_interval_s=1.0, batch_size=100, max_pending=2)  # type: ignore[arg-type]
    metrics = GatewayMetrics(max_tenants=1, max_models=1)
    metrics.usage_ledger.watch(writer)
    for i in range(5):
        writer.add(_record(i))
    values = _values(generate_latest(metrics.registry).decode())
    assert values["loragate_gateway_usage_records_dropped_total"] == 3 == writer.num_dropped
    assert values["loragate_gateway_usage_records_pending"] == 2

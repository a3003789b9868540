"""Issue 11, Grafana: every expression of the provisioned dashboard names only series the code
exports, derived from the code's own registries (the gateway's, and an engine's with LoRA on),
and the dashboard has the panels operators asked for. Issue 45: in the embedded mode the
gateway's own /metrics has every series the dashboard queries (the engine's histograms were
missing there, so two panels stayed empty)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from gateway_harness import MODEL, Gateway
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from engine.metrics import EngineMetrics
from engine.outputs import EngineStats, LoRAStats
from gateway.telemetry.metrics import GatewayMetrics

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy/grafana/loragate-dashboard.json"
SERIES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
          "gauge": ("",), "info": ("_info",), "summary": ("", "_sum", "_count")}  # fmt: skip
# PromQL pieces that are not metric names: label matchers, ranges, grouping clauses, strings.
NOT_NAMES = re.compile(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without)\s*\([^)]*\)|\"[^\"]*\"")
TOKEN = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?!\w)(?!\s*\()")  # a name not called as a function


def _zeros(cls: type) -> dict[str, Any]:
    return {f.name: 0 for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}  # fmt: skip


def exported_series() -> set[str]:
    """Every series name a scrape of the gateway or an engine (LoRA on) can show."""
    stats = EngineStats(**{**_zeros(EngineStats), "lora": LoRAStats(**_zeros(LoRAStats))})
    registries: list[CollectorRegistry] = [
        GatewayMetrics(max_tenants=1, max_models=1).registry,
        EngineMetrics(model_name="grafana", stats=lambda: stats).registry,
    ]
    return {
        family.name + suffix
        for registry in registries
        for family in registry.collect()
        for suffix in SERIES.get(family.type, ("",))
    }


def expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"])
            for panel in dashboard["panels"] if panel.get("type") != "row"
            for target in panel["targets"]]  # fmt: skip


def names_in(expr: str) -> set[str]:
    """The metric names an expression selects (functions, labels and ranges left out)."""
    return set(TOKEN.findall(NOT_NAMES.sub(" ", expr)))


def test_every_expression_names_exported_series() -> None:
    exported = exported_series()
    assert "loragate_gateway_usage_records_dropped_total" in exported  # derived, not listed
    unknown = []
    for title, expr in expressions():
        found = names_in(expr)
        assert found, f"{title}: no metric in {expr}"
        unknown += [f"{title}: {name}" for name in sorted(found - exported)]
        assert expr.count("(") == expr.count(")"), f"{title}: unbalanced {expr}"
    assert not unknown, "dashboard expressions name series nothing exports:\n" + "\n".join(unknown)


def test_the_name_check_catches_a_typo() -> None:
    assert names_in('sum(rate(loragate_gateway_requests_totl{tenant=~"$t"}[1m]))') == {
        "loragate_gateway_requests_totl"
    }
    assert "loragate_gateway_requests_totl" not in exported_series()


def test_panels_operators_asked_for() -> None:
    used = {name for _, expr in expressions() for name in names_in(expr)}
    wanted = {
        "adapters per tier": "loragate_engine_adapter_slots_occupied",
        "adapter swaps": "loragate_engine_adapter_misses_total",
        "queue wait by priority band": "loragate_engine_queue_wait_seconds_bucket",
        "preemptions": "vllm:num_preemptions_total",
        "per-tenant tokens": "loragate_gateway_completion_tokens_total",
        "rejections by reason": "loragate_gateway_rejections_total",
        "usage-ledger writes": "loragate_gateway_usage_records_written_total",
        "usage-ledger drops": "loragate_gateway_usage_records_dropped_total",
        "engine TTFT": "vllm:time_to_first_token_seconds_bucket",
        "engine TPOT": "vllm:time_per_output_token_seconds_bucket",
    }
    missing = [what for what, name in wanted.items() if name not in used]
    assert not missing, f"no panel for: {missing}"
    by_band = [e for _, e in expressions() if "loragate_engine_queue_wait_seconds_bucket" in e]
    assert all("priority_band" in e for e in by_band)


@pytest.mark.asyncio(loop_scope="module")
async def test_the_embedded_gateway_exports_every_series_the_dashboard_queries(
    gateway: Gateway,
) -> None:
    tenant = await gateway.tenant()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = await gateway.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
    assert r.status_code == 200, r.text
    refused = await gateway.client.post("/v1/chat/completions", json=body)  # a rejection
    assert refused.status_code == 401
    text = (await gateway.client.get("/metrics")).text
    scraped = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    queried = {name for _, expr in expressions() for name in names_in(expr)}
    assert not queried - scraped, (
        f"the dashboard queries what embedded /metrics lacks: {sorted(queried - scraped)}"
    )
    counts = {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.endswith("_count")
    }
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
                      "loragate_engine_queue_wait_seconds"):  # fmt: skip
        assert counts[histogram + "_count"] >= 1, histogram  # observed, not only declared

"""/health through draining and shutdown, and /metrics: vLLM's names, bounded tenant labels,
a registry of the engine's own."""

from __future__ import annotations

import httpx
from prometheus_client import REGISTRY, generate_latest

from engine.loop.async_engine import AsyncEngine
from engine.metrics import MAX_TENANT_LABELS, OTHER_TENANT, EngineMetrics, priority_band
from engine.outputs import EngineStats
from tests.engine.loop.async_helpers import TIMEOUT_S
from tests.engine.server.server_helpers import (
    GENERATE,
    gen_body,
    metric_samples,
)


async def test_health_is_503_once_draining(client: httpx.AsyncClient, engine: AsyncEngine):
    response = await client.get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    await engine.shutdown(drain_timeout_s=1)
    response = await client.get("/health")
    assert response.status_code == 503 and response.json() == {"status": "draining"}
    response = await client.post(GENERATE, json=gen_body())
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "server_error"


async def test_live_server_serves_and_drains(live_url: str, engine: AsyncEngine):
    async with httpx.AsyncClient(base_url=live_url, timeout=TIMEOUT_S) as http:
        assert (await http.get("/health")).status_code == 200
        response = await http.post(GENERATE, json=gen_body(max_tokens=3))
        assert len(response.json()["choices"][0]["token_ids"]) == 3
    # the fixture's teardown checks that uvicorn's shutdown drained the engine


VLLM_NAMES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:request_success_total",
]


async def test_metrics_names_and_values(client: httpx.AsyncClient, engine: AsyncEngine):
    before = engine.stats()
    await client.post(GENERATE, json=gen_body(max_tokens=4, priority=-3, fairness_key="tenant-a"))
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = metric_samples(response.text)
    for name in VLLM_NAMES:
        assert name in samples, name
        assert all(s.labels["model_name"] == engine.model_name for s in samples[name])
    generated = samples["vllm:generation_tokens_total"][0].value
    assert generated - before.generation_tokens_total == 4
    lengths = [
        s.value
        for s in samples["vllm:request_success_total"]
        if s.labels["finished_reason"] == "length"
    ]
    assert lengths == [1.0]
    ttft = samples["vllm:time_to_first_token_seconds_count"]
    assert [s.value for s in ttft] == [1.0]
    bands = {
        s.labels["priority_band"]: s.value
        for s in samples["loragate_engine_queue_wait_seconds_count"]
    }
    assert bands == {"lt0": 1.0}
    tenants = {s.labels["tenant"] for s in samples["loragate_engine_served_tokens"]}
    assert tenants and "tenant-a" not in tenants  # hashed, never in clear


def test_metrics_use_their_own_registry_and_bound_tenant_labels():
    served = {f"salt-{i}": 1000 - i for i in range(10_000)}
    stats = EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, served_tokens_by_tenant=served)
    first = EngineMetrics(model_name="m", stats=lambda: stats)
    second = EngineMetrics(model_name="m", stats=lambda: stats)  # no duplicate-name clash
    assert first.registry is not second.registry
    assert REGISTRY.get_sample_value("vllm:prompt_tokens_total", {"model_name": "m"}) is None
    text = generate_latest(first.registry).decode()
    assert "salt-" not in text
    series = metric_samples(text)["loragate_engine_served_tokens"]
    assert len(series) == MAX_TENANT_LABELS + 1
    other = [s.value for s in series if s.labels["tenant"] == OTHER_TENANT]
    assert other == [sum(sorted(served.values())[: len(served) - MAX_TENANT_LABELS])]


def test_priority_bands_are_a_fixed_small_set():
    assert {priority_band(p) for p in (-(2**63), -1, 0, 1, 2**63 - 1)} == {"lt0", "0", "gt0"}

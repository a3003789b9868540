"""What each engine replica is doing right now, for the dashboard's engines page.

- in-process: the engine's own stats snapshot and its adapter list (the same data its
  `/metrics` and `/v1/models` serve);
- HTTP replicas: health and adapter tiers as the client's poller last saw them, and the running,
  waiting and KV gauges read from each healthy replica's `/metrics` (its vLLM-named gauges, so a
  vLLM replica reads the same); what this gateway process routed there, and the prefix-cache
  hit rate it expected beside the one the replica reported (routing/router.py).

Replicas are named by index (`engine-0`), never by URL. Adapters are engine names (adapter ids);
the dashboard maps them to the names a viewer may see.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine import adapter_admin
from gateway.engines.api import EngineClient
from gateway.engines.http import HttpEngineClient
from gateway.engines.inprocess import INPROCESS, InProcessEngineClient
from gateway.engines.replicas import Replica, engine_device

METRICS_TIMEOUT_S = 2.0
GAUGES = {
    "vllm:num_requests_running": "num_running",
    "vllm:num_requests_waiting": "num_waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
}


@dataclass
class ReplicaStatus:
    name: str
    healthy: bool
    num_running: int | None = None  # None: not known (an unreachable replica)
    num_waiting: int | None = None
    kv_usage: float | None = None  # in [0, 1]
    num_outstanding: int | None = None  # this gateway's requests on it (HTTP mode)
    adapters_by_tier: dict[str, list[str]] = field(default_factory=dict)  # tier -> engine names
    device: str | None = None  # where its adapter slots (tier "gpu") are; None: not reported
    # HTTP mode, this gateway process only: requests sent, and the share of their prompt tokens
    # expected from the replica's prefix cache and reported from it (None: nothing sent yet).
    num_routed: int | None = None
    expected_hit_rate: float | None = None
    hit_rate: float | None = None


def _by_tier(tiers: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, tier in sorted(tiers.items()):
        out.setdefault(tier, []).append(name)
    return out


async def _inprocess(client: InProcessEngineClient) -> list[ReplicaStatus]:
    stats = client.stats()
    models = await adapter_admin.list_models(client.engine, created=0)
    tiers = {m["id"]: str(m["tier"]) for m in models if m.get("tier") is not None}
    return [
        ReplicaStatus(
            name=INPROCESS,
            healthy=(await client.check_ready())[INPROCESS],
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            kv_usage=stats.kv_usage,
            adapters_by_tier=_by_tier(tiers),
            device=engine_device({"data": models}),
        )
    ]


async def _replica(http: httpx.AsyncClient, replica: Replica) -> ReplicaStatus:
    status = ReplicaStatus(
        name=replica.name,
        healthy=replica.healthy,
        num_outstanding=replica.outstanding,
        adapters_by_tier=_by_tier(replica.adapters),
        device=replica.device,
        num_routed=sum(replica.routing.num_requests.values()),
        expected_hit_rate=replica.routing.expected_hit_rate,
        hit_rate=replica.routing.hit_rate,
    )
    if not replica.healthy:
        return status
    try:
        response = await http.get(replica.url + "/metrics", timeout=METRICS_TIMEOUT_S)
        response.raise_for_status()
        for family in text_string_to_metric_families(response.text):
            attribute = GAUGES.get(family.name)
            if attribute is not None and family.samples:
                value = sum(sample.value for sample in family.samples)
                setattr(status, attribute, value if attribute == "kv_usage" else int(value))
    except (httpx.HTTPError, ValueError):
        pass  # the gauges stay unknown; health is the poller's word
    return status


async def engine_status(client: EngineClient) -> list[ReplicaStatus]:
    if isinstance(client, InProcessEngineClient):
        return await _inprocess(client)
    if isinstance(client, HttpEngineClient):
        async with httpx.AsyncClient() as http:
            return list(await asyncio.gather(*(_replica(http, r) for r in client.replicas)))
    ready = await client.check_ready()  # another client (a test's wrapper): health only
    return [ReplicaStatus(name=name, healthy=ok) for name, ok in ready.items()]

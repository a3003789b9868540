"""Engine replicas as the HTTP client sees them, and the least-loaded routing policy
(LORAGATE_ENGINE_ROUTING=least_loaded; the cache-aware default is in routing/policy.py).

Least loaded: among healthy replicas, prefer one where the request's adapter is resident (the
highest tier its `/v1/models` reports: gpu, then cpu, then merely registered), then the one
with the fewest outstanding requests. Unhealthy replicas come last, so a request still tries
them when nothing else is left. Plain data and pure functions: unit-tested without engines.

Affinity has a bound: when the replica an adapter prefers has more than `spill_after` requests
outstanding beyond the least loaded healthy replica, the request spills there (and loads the
adapter on its way), so one hot adapter spreads over replicas instead of queueing on one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Higher is better; an adapter a replica does not list ranks 0.
TIER_RANK = {"gpu": 3, "cpu": 2, "disk": 1}

# Outstanding requests beyond the least loaded replica at which affinity gives way: a cold
# adapter load costs about what a few queued requests wait, so a handful is the break-even.
SPILL_AFTER = 8


@dataclass
class RoutingCounts:
    """What this gateway process sent one replica, and what the replica reported back: the
    routing metrics (gateway/telemetry/routing.py) and the engines page read them."""

    num_requests: dict[str, int] = field(default_factory=dict)  # by routing reason
    num_prompt_tokens: int = 0
    # Prompt tokens the gateway expected the replica to find in its prefix cache (it served
    # the prefix last), and those its usage events said it found.
    num_expected_cached_tokens: int = 0
    num_cached_tokens: int = 0

    @property
    def expected_hit_rate(self) -> float | None:
        if not self.num_prompt_tokens:
            return None
        return self.num_expected_cached_tokens / self.num_prompt_tokens

    @property
    def hit_rate(self) -> float | None:
        if not self.num_prompt_tokens:
            return None
        return self.num_cached_tokens / self.num_prompt_tokens


@dataclass
class Replica:
    index: int
    url: str
    healthy: bool = True
    outstanding: int = 0
    # adapter engine name -> tier, from the replica's /v1/models
    adapters: dict[str, str] = field(default_factory=dict)
    device: str | None = None  # its adapter slots' device, from /v1/models (vLLM's: not said)
    routing: RoutingCounts = field(default_factory=RoutingCounts)

    @property
    def name(self) -> str:
        """How readiness reports it: an index, never the URL."""
        return f"engine-{self.index}"

    def adapter_rank(self, adapter: str | None) -> int:
        if adapter is None:
            return 0
        tier = self.adapters.get(adapter)
        if tier is None:
            return 0
        return TIER_RANK.get(tier, 1)


def route(
    replicas: list[Replica], adapter: str | None, *, spill_after: int = SPILL_AFTER
) -> list[Replica]:
    """Every replica, best first (the caller tries them in this order)."""
    ranked = sorted(
        replicas,
        key=lambda r: (not r.healthy, -r.adapter_rank(adapter), r.outstanding, r.index),
    )
    healthy = [r for r in ranked if r.healthy]
    if adapter is None or not healthy:
        return ranked
    least = min(healthy, key=lambda r: (r.outstanding, r.index))
    if ranked[0].outstanding - least.outstanding > spill_after:
        ranked.remove(least)
        ranked.insert(0, least)
    return ranked


def engine_device(models: object) -> str | None:
    """The device a loragate engine's `/v1/models` names on its base model entry, if any."""
    data = models.get("data") if isinstance(models, dict) else None
    for entry in data if isinstance(data, list) else []:
        if isinstance(entry, dict) and "tier" not in entry and isinstance(entry.get("device"), str):
            return str(entry["device"])
    return None


def adapter_tiers(models: object) -> dict[str, str]:
    """adapter name -> tier from an engine's `/v1/models` body (base model entries skipped)."""
    tiers: dict[str, str] = {}
    data = models.get("data") if isinstance(models, dict) else None
    for entry in data if isinstance(data, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        tier = entry.get("tier")
        if isinstance(tier, str):
            tiers[entry["id"]] = tier
    return tiers

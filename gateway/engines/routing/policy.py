"""The cache-aware routing policy: pure functions over replicas, unit-tested without engines.

A request prefers, among healthy replicas:
1. the replica that last served the longest prefix of its prompt (affinity.py): its KV blocks
   are likely still in that engine's prefix cache;
2. else replicas holding its adapter, the highest tier first (replicas.py's tiers);
3. among equals, the request's home: rendezvous hashing over the replica URLs keyed by its
   anchor (the salt, the model and the first block: prefix.py). Every gateway process computes
   the same home, so a conversation a process has not seen yet still lands where the others
   sent it.

Load is bounded as in consistent hashing with bounded loads: a replica takes the request only if
it stays within `load_factor` x the mean (capacity() below); otherwise the request spills to the
next replica in its order, so a hot tenant or adapter spreads instead of queueing on one replica.
Some replica always fits (the least loaded is at most the mean, and load_factor >= 1), so the
chosen replica never passes the bound. Unhealthy replicas come last, least loaded first, so a
request still tries them when nothing else is left.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from gateway.engines.replicas import Replica
from gateway.engines.routing.affinity import Match

# How far above the mean load a replica may go for the sake of its cache (the bound of
# consistent hashing with bounded loads, c = 1 + epsilon). 1.5, the most load one replica is
# meant to carry (issue 44): a spill costs the request its whole prefill, so the loosest bound
# the fleet tolerates serves best (bench/RESULTS.md measures 1.25 beside it).
LOAD_FACTOR = 1.5

# LORAGATE_ENGINE_ROUTING: this module's policy, or replicas.py's `route` (adapter residency,
# then fewest outstanding requests), kept to compare against and to fall back on.
RoutingPolicy = Literal["cache_aware", "least_loaded"]


class Reason(StrEnum):
    """Why the first replica of an order is first (a metric label)."""

    PREFIX = "prefix"  # it served this prompt's longest known prefix
    ADAPTER = "adapter"  # the adapter is resident there
    HOME = "home"  # the request's home replica (rendezvous hashing)
    SPILL = "spill"  # a replica ahead of it was at capacity
    LEAST_LOADED = "least_loaded"  # the least-loaded policy chose it
    RETRY = "retry"  # the replicas ahead of it failed this request
    UNHEALTHY = "unhealthy"  # no replica is healthy: tried anyway
    ONLY = "only"  # the fleet has one replica: nothing to choose


@dataclass(frozen=True)
class Route:
    order: list[Replica]  # every replica, best first: the client tries them in this order
    reason: Reason


def capacity(replicas: list[Replica], load_factor: float = LOAD_FACTOR) -> int:
    """The most requests a healthy replica may hold once this one is placed: ceil(load_factor x
    (outstanding + 1) / replicas), over healthy replicas."""
    total = sum(r.outstanding for r in replicas) + 1
    return math.ceil(load_factor * total / len(replicas))


def home_score(anchor: int, replica: Replica) -> int:
    """Rendezvous hashing: a request's replicas ordered by this score, highest first. Removing
    a replica moves only the requests whose home it was."""
    text = f"{anchor}\x00{replica.url}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def cache_aware(
    replicas: list[Replica],
    *,
    adapter: str | None,
    anchor: int,
    match: Match | None,
    load_factor: float = LOAD_FACTOR,
) -> Route:
    if load_factor < 1.0:
        raise ValueError(f"load_factor must be at least 1, got {load_factor}")
    healthy = [r for r in replicas if r.healthy]
    unhealthy = sorted(
        (r for r in replicas if not r.healthy), key=lambda r: (r.outstanding, r.index)
    )
    if not healthy:
        return Route(unhealthy, Reason.UNHEALTHY)
    prefix = match.replica if match is not None else None
    preferred = sorted(
        healthy,
        key=lambda r: (r.index != prefix, -r.adapter_rank(adapter), -home_score(anchor, r)),
    )
    limit = capacity(healthy, load_factor)
    chosen = next(r for r in preferred if r.outstanding + 1 <= limit)
    if chosen is not preferred[0]:
        reason = Reason.SPILL
    elif chosen.index == prefix:
        reason = Reason.PREFIX
    elif chosen.adapter_rank(adapter) > 0:
        reason = Reason.ADAPTER
    else:
        reason = Reason.HOME
    preferred.remove(chosen)
    return Route([chosen, *preferred, *unhealthy], reason)

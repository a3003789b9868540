"""The routing state of one HTTP engine client: the policy the settings chose, the prefix map,
and what each replica was sent and expected to hit (the routing metrics and the engines page).

`plan()` orders the replicas for a request; the client tries them in that order and calls
`served()` with the one that took it, which records the prompt's prefix keys against it. Under
either policy the keys are derived and the expected hits counted, so the two policies' metrics
compare on one gateway.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.protocol import GenerateRequest
from gateway.engines.replicas import SPILL_AFTER, Replica, route
from gateway.engines.routing.affinity import MAX_ENTRIES, Match, PrefixMap
from gateway.engines.routing.policy import LOAD_FACTOR, Reason, Route, RoutingPolicy, cache_aware
from gateway.engines.routing.prefix import PrefixKeys, prefix_keys


@dataclass(frozen=True)
class Plan:
    route: Route
    num_prompt_tokens: int
    keys: PrefixKeys | None  # None: one replica, nothing to choose, no keys derived
    match: Match | None  # where the longest known prefix was served


class Router:
    def __init__(
        self,
        policy: RoutingPolicy = "cache_aware",
        *,
        block_size: int = 16,
        load_factor: float = LOAD_FACTOR,
        spill_after: int = SPILL_AFTER,
        max_prefixes: int = MAX_ENTRIES,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if load_factor < 1.0:
            raise ValueError(f"load_factor must be at least 1, got {load_factor}")
        self.policy = policy
        self.block_size = block_size
        self.load_factor = load_factor
        self.spill_after = spill_after
        self.prefixes = PrefixMap(max_prefixes)

    def plan(self, replicas: list[Replica], request: GenerateRequest) -> Plan:
        if len(replicas) == 1:
            # Nothing to choose: the keys and the policy would cost about 20 us a request
            # (32 prompt tokens; 70 at 1,000) for one answer. The replica's expected hits are
            # then not counted (its reported ones are).
            return Plan(Route(list(replicas), Reason.ONLY), len(request.token_ids), None, None)
        keys = prefix_keys(
            request.token_ids,
            cache_salt=request.cache_salt,
            model=request.model,
            block_size=self.block_size,
        )
        match = self.prefixes.lookup(keys.keys)
        if self.policy == "least_loaded":
            order = route(replicas, request.model, spill_after=self.spill_after)
            healthy = bool(order) and order[0].healthy
            reason = Reason.LEAST_LOADED if healthy else Reason.UNHEALTHY
            return Plan(Route(order, reason), keys.num_prompt_tokens, keys, match)
        chosen = cache_aware(
            replicas,
            adapter=request.model,
            anchor=keys.anchor,
            match=match,
            load_factor=self.load_factor,
        )
        return Plan(chosen, keys.num_prompt_tokens, keys, match)

    def served(self, plan: Plan, replica: Replica) -> None:
        """`replica` took the request: count it and remember where its prefix now is."""
        first = plan.route.order[0] is replica
        reason = plan.route.reason if first else Reason.RETRY
        counts = replica.routing
        counts.num_requests[reason] = counts.num_requests.get(reason, 0) + 1
        counts.num_prompt_tokens += plan.num_prompt_tokens
        if plan.keys is None:
            return
        if plan.match is not None and plan.match.replica == replica.index:
            expected = plan.keys.num_cacheable_tokens(plan.match.num_blocks)
            counts.num_expected_cached_tokens += expected
        self.prefixes.record(plan.keys.keys, replica.index)

"""The cache-aware policy (gateway/engines/routing/policy.py) and the router that keeps its state
(router.py), on plain replicas: a conversation sticks to the replica that served it, the load
stays bounded, a hot tenant spills, unhealthy replicas come last."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.protocol import GenerateRequest, GenerateSamplingParams
from gateway.engines.replicas import Replica
from gateway.engines.routing.affinity import Match
from gateway.engines.routing.policy import Reason, cache_aware, capacity, home_score
from gateway.engines.routing.router import Router

BS = 4


def fleet(*outstanding: int) -> list[Replica]:
    return [Replica(i, f"http://engine-{i}", outstanding=n) for i, n in enumerate(outstanding)]


def request(tokens: list[int], salt: str = "tenant-a", model: str = "tiny") -> GenerateRequest:
    return GenerateRequest(
        token_ids=tokens, sampling_params=GenerateSamplingParams(), cache_salt=salt, model=model
    )


def test_the_prefix_replica_comes_first_within_capacity() -> None:
    replicas = fleet(2, 1, 1)
    route = cache_aware(replicas, adapter=None, anchor=7, match=Match(0, 3))
    assert route.order[0].index == 0 and route.reason is Reason.PREFIX
    assert sorted(r.index for r in route.order) == [0, 1, 2]


def test_an_overloaded_prefix_replica_spills() -> None:
    replicas = fleet(6, 1, 1)  # capacity: ceil(1.5 * 9 / 3) = 5
    route = cache_aware(replicas, adapter=None, anchor=7, match=Match(0, 3))
    assert route.order[0].index != 0 and route.reason is Reason.SPILL
    assert route.order[1].index == 0  # still next: a failure of the first falls back to it


def test_a_new_conversation_goes_to_its_home_the_same_in_every_process() -> None:
    replicas = fleet(0, 0, 0)
    homes = set()
    for anchor in range(200):
        route = cache_aware(replicas, adapter=None, anchor=anchor, match=None)
        assert route.reason is Reason.HOME
        best = max(replicas, key=lambda r: home_score(anchor, r))
        assert route.order[0] is best
        homes.add(best.index)
    assert homes == {0, 1, 2}  # anchors spread over every replica


def test_adapter_residency_before_home() -> None:
    replicas = fleet(0, 0, 0)
    replicas[2].adapters = {"sql": "gpu"}
    replicas[1].adapters = {"sql": "cpu"}
    for anchor in range(20):
        route = cache_aware(replicas, adapter="sql", anchor=anchor, match=None)
        assert [r.index for r in route.order[:2]] == [2, 1] and route.reason is Reason.ADAPTER


def test_unhealthy_replicas_come_last_even_holding_the_prefix() -> None:
    replicas = fleet(0, 5, 0)
    replicas[0].healthy = False
    replicas[2].healthy = False
    route = cache_aware(replicas, adapter=None, anchor=1, match=Match(0, 9))
    assert [r.index for r in route.order] == [1, 0, 2]
    for replica in replicas:
        replica.healthy = False
    route = cache_aware(replicas, adapter=None, anchor=1, match=Match(0, 9))
    assert route.reason is Reason.UNHEALTHY and [r.index for r in route.order] == [0, 2, 1]


@given(
    st.lists(st.integers(0, 30), min_size=1, max_size=6),
    st.lists(st.booleans(), min_size=6, max_size=6),
    st.integers(0, 2**63),
    st.one_of(st.none(), st.integers(0, 5)),
    st.floats(1.0, 3.0),
)
def test_the_first_replica_never_passes_the_bound(
    loads: list[int], healthy: list[bool], anchor: int, prefix: int | None, factor: float
) -> None:
    replicas = fleet(*loads)
    for replica, ok in zip(replicas, healthy, strict=False):
        replica.healthy = ok
    match = Match(prefix, 2) if prefix is not None and prefix < len(replicas) else None
    route = cache_aware(replicas, adapter=None, anchor=anchor, match=match, load_factor=factor)
    assert sorted(r.index for r in route.order) == list(range(len(replicas)))
    up = [r for r in replicas if r.healthy]
    if up:
        assert route.order[0].healthy
        assert route.order[0].outstanding + 1 <= capacity(up, factor)
        assert all(r.healthy for r in route.order[: len(up)])  # unhealthy last


def turn(history: list[int], rng: random.Random, num_tokens: int) -> list[int]:
    return [*history, *(rng.randrange(1000) for _ in range(num_tokens))]


def test_a_conversation_sticks_to_one_replica_turn_after_turn() -> None:
    router = Router(block_size=BS)
    replicas = fleet(0, 0, 0)
    rng = random.Random(0)
    history = turn([], rng, 10)
    served = []
    for _ in range(6):
        plan = router.plan(replicas, request(history))
        router.served(plan, plan.route.order[0])
        served.append(plan.route.order[0].index)
        history = turn(history, rng, 9)  # the answer and the next message
    assert len(set(served)) == 1
    counts = replicas[served[0]].routing
    assert counts.num_requests == {"home": 1, "prefix": 5}
    assert counts.num_expected_cached_tokens > 0.5 * counts.num_prompt_tokens


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 5), st.integers(1, 40))
def test_load_stays_bounded_while_hot_tenants_spill(seed: int, num_replicas: int, hot: int) -> None:
    """Requests arrive and finish at random; one tenant is hot (most requests share its
    conversation). The replica each request lands on stays within the bound, and the hot
    tenant's requests spread over more than one replica once they outnumber it."""
    rng = random.Random(seed)
    router = Router(block_size=BS)
    replicas = fleet(*[0] * num_replicas)
    hot_prompt = turn([], rng, 12)
    open_on: list[Replica] = []
    hot_replicas = set()
    for _ in range(200):
        if open_on and rng.random() < 0.4:
            open_on.pop(rng.randrange(len(open_on))).outstanding -= 1
            continue
        is_hot = rng.randrange(40) < hot
        tokens = hot_prompt if is_hot else turn([], rng, 12)
        plan = router.plan(replicas, request(tokens, salt="hot" if is_hot else str(rng.random())))
        chosen = plan.route.order[0]
        total = sum(r.outstanding for r in replicas) + 1
        chosen.outstanding += 1
        assert chosen.outstanding <= math.ceil(router.load_factor * total / num_replicas)
        router.served(plan, chosen)
        open_on.append(chosen)
        if is_hot:
            hot_replicas.add(chosen.index)
    if hot >= 30:  # three quarters of all requests: more than one replica's fair share
        assert len(hot_replicas) > 1


def test_the_least_loaded_policy_is_todays_order() -> None:
    router = Router("least_loaded", block_size=BS)
    replicas = fleet(3, 1, 2)
    replicas[2].adapters = {"sql": "gpu"}
    plan = router.plan(replicas, request(list(range(9)), model="sql"))
    assert [r.index for r in plan.route.order] == [2, 1, 0]
    assert plan.route.reason is Reason.LEAST_LOADED
    plan = router.plan(replicas, request(list(range(9)), model="tiny"))
    assert [r.index for r in plan.route.order] == [1, 2, 0]


def test_a_failover_counts_as_a_retry_and_moves_the_prefix() -> None:
    router = Router(block_size=BS)
    replicas = fleet(0, 0, 0)
    prompt = list(range(20))
    plan = router.plan(replicas, request(prompt))
    second = plan.route.order[1]
    router.served(plan, second)  # the first failed before its first event
    assert second.routing.num_requests == {"retry": 1}
    again = router.plan(replicas, request(prompt))
    assert again.match == Match(second.index, 5) and again.route.order[0] is second
    router.served(again, second)
    assert second.routing.num_expected_cached_tokens == 16  # 4 blocks: the 20th token recomputed


def test_one_replica_is_chosen_without_keys_and_still_counted() -> None:
    for policy in ("cache_aware", "least_loaded"):
        router = Router(policy, block_size=BS)
        (only,) = fleet(5)
        prompt = list(range(20))
        for _ in range(2):
            plan = router.plan([only], request(prompt))
            assert plan.route.order == [only] and plan.route.reason is Reason.ONLY
            assert plan.keys is None and plan.match is None
            router.served(plan, only)
        assert only.routing.num_requests == {"only": 2}
        assert only.routing.num_prompt_tokens == 40
        assert only.routing.num_expected_cached_tokens == 0 and len(router.prefixes) == 0

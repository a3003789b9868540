"""Replica routing (adapter residency first, then fewest outstanding) and the vLLM wire form."""

from __future__ import annotations

import json

from engine.protocol import GenerateRequest, GenerateSamplingParams
from gateway.engines.http import wire_body
from gateway.engines.replicas import Replica, adapter_tiers, route


def _replicas() -> list[Replica]:
    return [
        Replica(0, "http://a", outstanding=5, adapters={"sql": "cpu"}),
        Replica(1, "http://b", outstanding=1),
        Replica(2, "http://c", outstanding=9, adapters={"sql": "gpu"}),
        Replica(3, "http://d", outstanding=0, healthy=False, adapters={"sql": "gpu"}),
    ]


def test_adapter_residency_first_then_least_outstanding() -> None:
    assert [r.index for r in route(_replicas(), "sql")] == [2, 0, 1, 3]
    assert [r.index for r in route(_replicas(), None)] == [1, 0, 2, 3]
    assert [r.index for r in route(_replicas(), "other")] == [1, 0, 2, 3]


def test_unhealthy_replicas_are_tried_last() -> None:
    replicas = _replicas()
    for replica in replicas[:3]:
        replica.healthy = False
    assert [r.index for r in route(replicas, "sql")] == [3, 2, 0, 1]
    assert [r.index for r in route(replicas, None)] == [3, 1, 0, 2]


def test_adapter_tiers_from_models_body() -> None:
    body = {"object": "list", "data": [
        {"id": "tiny", "object": "model"},
        {"id": "a1", "object": "model", "tier": "gpu", "rank": 8},
        {"id": "a2", "object": "model", "tier": "disk"},
        {"bad": 1}, "junk",
    ]}  # fmt: skip
    assert adapter_tiers(body) == {"a1": "gpu", "a2": "disk"}
    assert adapter_tiers("not json") == {}


def test_vllm_mode_drops_extensions_and_maps_priority() -> None:
    request = GenerateRequest(
        request_id="r1",
        token_ids=[1, 2],
        sampling_params=GenerateSamplingParams(max_tokens=3),
        cache_salt="s",
        priority=12,
        fairness_key="tenant",
    )
    ours = json.loads(wire_body(request, vllm=False, vllm_priority=lambda p: p + 100))
    assert ours["fairness_key"] == "tenant" and ours["priority"] == 12
    theirs = json.loads(wire_body(request, vllm=True, vllm_priority=lambda p: p + 100))
    assert "fairness_key" not in theirs
    assert theirs["priority"] == 112
    assert theirs["cache_salt"] == "s" and theirs["token_ids"] == [1, 2]

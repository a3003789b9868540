"""Rendering engine outputs on the wire (docs/tokens-api.md): the non-streaming body,
logprobs in vLLM's tokens-only shape, stream chunks and SSE framing. Parsing requests:
test_protocol.py."""

from __future__ import annotations

import json
import math
from typing import Any

from engine.outputs import (
    CompletionDelta,
    FinishReason,
    PositionLogprobs,
    RequestOutput,
    TokenLogprob,
)
from engine.protocol import (
    MIN_WIRE_LOGPROB,
    SSE_DONE,
    ChoiceCollector,
    ChoiceLogprobs,
    GenerateChoice,
    GenerateRequest,
    LogprobContent,
    ResponseBuilder,
    parse_generate_request,
    sse_event,
)
from engine.request import RequestId


def _wire(**fields: Any) -> GenerateRequest:
    payload: dict[str, Any] = {"token_ids": [1, 2, 3], "sampling_params": {}, "request_id": "r"}
    payload.update(fields)
    return parse_generate_request(json.dumps(payload))


def _lp(token_id: int, logprob: float, rank: int = 1) -> TokenLogprob:
    return TokenLogprob(token_id=token_id, logprob=logprob, rank=rank)


def _output(
    choices: list[CompletionDelta], *, finished: bool = False, **fields: Any
) -> RequestOutput:
    return RequestOutput(
        request_id=RequestId("r"),
        choices=choices,
        finished=finished,
        num_prompt_tokens=3,
        num_cached_tokens=fields.pop("num_cached_tokens", 0),
        **fields,
    )


def test_non_streaming_body_accumulates_every_choice():
    builder = ResponseBuilder(_wire(sampling_params={"n": 2}, kv_transfer_params={"k": [1]}))
    builder.add(_output([CompletionDelta(0, [5]), CompletionDelta(1, [6])]))
    builder.add(_output([CompletionDelta(1, [7], finish_reason=FinishReason.STOP, stop_reason=7)]))
    builder.add(
        _output(
            [CompletionDelta(0, [8, 9], finish_reason=FinishReason.LENGTH)],
            finished=True,
            num_cached_tokens=2,
        )
    )
    payload = json.loads(builder.response().model_dump_json())
    assert payload == {
        "request_id": "r",
        "choices": [
            {
                "index": 0,
                "token_ids": [5, 8, 9],
                "finish_reason": "length",
                "stop_reason": None,
                "logprobs": None,
            },
            {
                "index": 1,
                "token_ids": [6, 7],
                "finish_reason": "stop",
                "stop_reason": 7,
                "logprobs": None,
            },
        ],
        "prompt_logprobs": None,
        "kv_transfer_params": {"k": [1]},
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "cached_tokens": 2},
    }


def _content(token_id: int) -> LogprobContent:
    return LogprobContent(token=f"token_id:{token_id}", logprob=-1.0)


def test_choice_collector_appends_in_order_and_keeps_the_first_finish():
    collector = ChoiceCollector(2, want_logprobs=True)
    collector.add(
        [
            GenerateChoice(index=1, token_ids=[6], logprobs=ChoiceLogprobs(content=[_content(6)])),
            GenerateChoice(index=0, token_ids=[5], logprobs=ChoiceLogprobs(content=[_content(5)])),
        ]
    )
    collector.add(
        [
            GenerateChoice(
                index=0,
                token_ids=[7, 8],
                finish_reason="stop",
                stop_reason=8,
                logprobs=ChoiceLogprobs(content=[_content(7), _content(8)]),
            )
        ]
    )
    # a later finish (the abort that follows a stop) does not replace the first
    collector.add([GenerateChoice(index=0, token_ids=[], finish_reason="abort")])
    first, second = collector.choices()
    assert (first.index, first.token_ids, first.finish_reason, first.stop_reason) == (
        0,
        [5, 7, 8],
        "stop",
        8,
    )
    assert first.logprobs is not None
    assert [c.token for c in first.logprobs.content] == ["token_id:5", "token_id:7", "token_id:8"]
    assert (second.index, second.token_ids, second.finish_reason) == (1, [6], None)


def test_choice_collector_without_logprobs_keeps_none():
    collector = ChoiceCollector(1, want_logprobs=False)
    collector.add(
        [GenerateChoice(index=0, token_ids=[5], logprobs=ChoiceLogprobs(content=[_content(5)]))]
    )
    (choice,) = collector.choices()
    assert choice.token_ids == [5] and choice.logprobs is None


def test_logprobs_wire_shape_is_vllm_tokens_only():
    builder = ResponseBuilder(_wire(sampling_params={"logprobs": 2, "prompt_logprobs": 1}))
    position = PositionLogprobs(chosen=_lp(5, -0.5, 1), top=(_lp(5, -0.5, 1), _lp(9, -math.inf, 2)))
    builder.add(
        _output(
            [CompletionDelta(0, [5], logprobs=[position], finish_reason=FinishReason.STOP)],
            finished=True,
            prompt_logprobs=[
                None,
                PositionLogprobs(chosen=_lp(2, -3.0, 7), top=(_lp(11, -0.1, 1),)),
                PositionLogprobs(chosen=_lp(3, -0.2, 1), top=(_lp(3, -0.2, 1),)),
            ],
        )
    )
    payload = json.loads(builder.response().model_dump_json())
    assert payload["choices"][0]["logprobs"] == {
        "content": [
            {
                "token": "token_id:5",
                "logprob": -0.5,
                "bytes": None,
                "top_logprobs": [
                    {"token": "token_id:5", "logprob": -0.5, "bytes": None},
                    {"token": "token_id:9", "logprob": MIN_WIRE_LOGPROB, "bytes": None},
                ],
            }
        ]
    }
    assert payload["prompt_logprobs"] == [
        None,
        {"2": {"logprob": -3.0, "rank": 7}, "11": {"logprob": -0.1, "rank": 1}},
        {"3": {"logprob": -0.2, "rank": 1}},
    ]


def test_stream_chunks_carry_only_new_tokens_and_finish_last():
    builder = ResponseBuilder(_wire(stream=True, kv_transfer_params={"k": 1}))
    first = builder.chunk(_output([CompletionDelta(0, [5, 6])]))
    nothing = builder.chunk(_output([]))
    last = builder.chunk(
        _output([CompletionDelta(0, [7], finish_reason=FinishReason.LENGTH)], finished=True)
    )
    assert first is not None and last is not None and nothing is None
    assert [c.token_ids for c in first.choices] == [[5, 6]]
    assert first.choices[0].finish_reason is None
    assert first.kv_transfer_params == {"k": 1}
    assert [c.token_ids for c in last.choices] == [[7]]
    assert last.choices[0].finish_reason == "length"
    assert last.kv_transfer_params is None and last.usage is None
    usage = builder.usage_chunk()
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens == 3 and usage.request_id == "r"


def test_error_never_appears_as_a_finish_reason():
    builder = ResponseBuilder(_wire())
    chunk = builder.chunk(
        _output([CompletionDelta(0, [], finish_reason=FinishReason.ERROR)], finished=True)
    )
    assert chunk is not None and chunk.choices == []


def test_sse_framing():
    builder = ResponseBuilder(_wire(stream=True))
    chunk = builder.chunk(_output([CompletionDelta(0, [5])]))
    assert chunk is not None
    event = sse_event(chunk)
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n")
    assert event.count(b"\n") == 2
    assert json.loads(event[len(b"data: ") :])["choices"][0]["token_ids"] == [5]
    assert SSE_DONE == b"data: [DONE]\n\n"

"""The pass-through `Output` (gateway/passthrough/output.py): the engine's events with the
client's request id put back, streamed as they come or collected into one body."""

from __future__ import annotations

import json

from engine.protocol import (
    SSE_DONE,
    ChoiceLogprobs,
    GenerateChoice,
    GenerateResponse,
    LogprobContent,
    Usage,
)
from gateway.passthrough.output import WireOutput


def _event(*choices: GenerateChoice, usage: Usage | None = None) -> GenerateResponse:
    return GenerateResponse(request_id="engine-id", choices=list(choices), usage=usage)


def _logprobs(token_id: int) -> ChoiceLogprobs:
    return ChoiceLogprobs(content=[LogprobContent(token=f"token_id:{token_id}", logprob=-1.0)])


def test_whole_body_collects_every_choice_under_the_clients_id():
    output = WireOutput("client-id", n=2, want_logprobs=True, include_usage=False, stream=False)
    usage = Usage(prompt_tokens=3, completion_tokens=3, cached_tokens=1)
    first = _event(GenerateChoice(index=0, token_ids=[5], logprobs=_logprobs(5)))
    assert output.feed(0, first) == b""  # whole: nothing is sent before the body
    output.feed(
        0,
        _event(
            GenerateChoice(index=1, token_ids=[6], finish_reason="length", logprobs=_logprobs(6)),
            GenerateChoice(
                index=0, token_ids=[7], finish_reason="stop", stop_reason=7, logprobs=_logprobs(7)
            ),
        ),
    )
    output.feed(0, _event(usage=usage))
    assert output.is_done and output.finish_reason == "length"
    assert output.num_completion_tokens == 3 and output.num_cached_tokens == 1
    body = json.loads(output.body())
    assert body["request_id"] == "client-id" and body["usage"] == usage.model_dump()
    assert [(c["index"], c["token_ids"], c["finish_reason"]) for c in body["choices"]] == [
        (0, [5, 7], "stop"),
        (1, [6], "length"),
    ]
    tokens = [entry["token"] for entry in body["choices"][0]["logprobs"]["content"]]
    assert tokens == ["token_id:5", "token_id:7"]


def test_stream_sends_each_event_and_drops_usage_not_asked_for():
    output = WireOutput("client-id", n=1, want_logprobs=False, include_usage=False, stream=True)
    sent = output.feed(0, _event(GenerateChoice(index=0, token_ids=[5], finish_reason="stop")))
    assert sent.startswith(b"data: ") and sent.endswith(b"\n\n")
    payload = json.loads(sent[len(b"data: ") :])
    assert payload["request_id"] == "client-id" and payload["choices"][0]["token_ids"] == [5]
    usage = Usage(prompt_tokens=3, completion_tokens=1, cached_tokens=0)
    assert output.feed(0, _event(usage=usage)) == b""
    assert output.tail() == SSE_DONE

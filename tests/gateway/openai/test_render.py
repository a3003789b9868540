"""The pieces chat and completions share (gateway/openai/render.py): the envelope of bodies
and chunks, with `usage` only where the client asked for it, and the whole answer gathered
from its deltas."""

from __future__ import annotations

import json

from engine.protocol import SSE_DONE
from gateway.openai.render import Answer, Envelope
from gateway.text.choices import ChoiceDelta, TokenLogprob

USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def _envelope(*, include_usage: bool) -> Envelope:
    return Envelope(
        response_id="chatcmpl-1",
        object="chat.completion.chunk",
        created=7,
        model="m",
        include_usage=include_usage,
    )


def _event(chunk: bytes) -> dict[str, object]:
    assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
    return json.loads(chunk[len(b"data: ") :])


def test_body_names_its_own_object_and_carries_usage():
    body = _envelope(include_usage=False).body([{"index": 0}], USAGE, object="chat.completion")
    assert body == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 7,
        "model": "m",
        "choices": [{"index": 0}],
        "usage": USAGE,
    }
    assert _envelope(include_usage=False).body([], USAGE)["object"] == "chat.completion.chunk"


def test_stream_with_usage_nulls_it_per_chunk_then_sends_it_alone():
    envelope = _envelope(include_usage=True)
    assert _event(envelope.chunk([{"index": 0}])) == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [{"index": 0}],
        "usage": None,
    }
    usage_chunk, done = envelope.stream_end(USAGE)
    assert _event(usage_chunk)["choices"] == [] and _event(usage_chunk)["usage"] == USAGE
    assert done == SSE_DONE


def test_stream_without_usage_never_names_it():
    envelope = _envelope(include_usage=False)
    assert "usage" not in _event(envelope.chunk([{"index": 0}]))
    assert envelope.stream_end(USAGE) == [SSE_DONE]


def test_answer_gathers_each_choice_from_its_deltas():
    answer = Answer(2)
    first = TokenLogprob(token_id=5, logprob=-0.5, top=((5, -0.5),))
    second = TokenLogprob(token_id=6, logprob=-1.0, top=())
    answer.add(
        [
            ChoiceDelta(index=0, text="Hel", num_tokens=1, logprobs=[first]),
            ChoiceDelta(index=1, text="x", num_tokens=1),
        ]
    )
    answer.add(
        [
            ChoiceDelta(
                index=0,
                text="lo",
                num_tokens=1,
                logprobs=[second],
                finish_reason="stop",
                stop_reason="\n",
            )
        ]
    )
    zero, one = answer.choices
    assert (zero.text, zero.logprobs, zero.finish_reason, zero.stop_reason) == (
        "Hello",
        [first, second],
        "stop",
        "\n",
    )
    assert (one.text, one.logprobs, one.finish_reason) == ("x", [], None)

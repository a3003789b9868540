"""The engine call's `traceparent` on the bytes a real socket gets: sent to loragate engines and
to vLLM alike (the same client), only when tracing is on; off, no such header at all."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine.protocol import GenerateRequest, GenerateSamplingParams
from gateway.engines.http import HttpEngineClient

EVENT = {"request_id": "r1", "choices": [{"index": 0, "token_ids": [5], "finish_reason": "length"}]}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("vllm", [False, True])
async def test_the_traceparent_goes_out_only_when_given(vllm: bool) -> None:
    heads: list[bytes] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        body = f"data: {json.dumps(EVENT)}\n\ndata: [DONE]\n\n".encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = HttpEngineClient(
        [f"http://127.0.0.1:{port}"], model_name="tiny", max_model_len=64, vocab_size=100,
        vllm=vllm,
    )  # fmt: skip
    try:
        for traceparent in (TRACEPARENT, None):
            request = GenerateRequest(request_id="r1", token_ids=[1, 2],
                                      sampling_params=GenerateSamplingParams(max_tokens=1))  # fmt: skip
            stream = await client.open(request, None, traceparent)
            assert [e.choices[0].token_ids async for e in stream] == [[5]]
            await stream.aclose()
    finally:
        await client.close()
        server.close()
    traced, untraced = heads
    assert traced.startswith(b"POST /inference/v1/generate HTTP/1.1\r\n")
    assert f"\r\ntraceparent: {TRACEPARENT}\r\n".encode() in traced
    assert b"traceparent" not in untraced.lower()

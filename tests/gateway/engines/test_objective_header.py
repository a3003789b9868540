"""Behind the Gateway API Inference Extension, each engine request names its tier's
InferenceObjective in `x-gateway-inference-objective`; checked on the bytes a real socket gets."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from engine.protocol import GenerateRequest, GenerateSamplingParams
from gateway.engines.http import HttpEngineClient
from gateway.engines.objectives import objective_header
from gateway.settings import GatewaySettings
from tenancy.priority import PriorityMapper
from tenancy.settings import TierBand

EVENT = {"request_id": "r1", "choices": [{"index": 0, "token_ids": [5], "finish_reason": "length"}]}


def test_tier_of_a_priority() -> None:
    mapper = PriorityMapper({
        "realtime": TierBand(lo=0, hi=9, default=0),
        "standard": TierBand(lo=5, hi=19, default=10),  # overlaps realtime on 5..9
        "batch": TierBand(lo=20, hi=29, default=20),
    })  # fmt: skip
    assert [mapper.tier_of(p) for p in (0, 7, 12, 29, 30)] == [
        "realtime", "realtime", "standard", "batch", None]  # fmt: skip
    assert objective_header("lg-batch") == b"x-gateway-inference-objective: lg-batch\r\n"
    assert objective_header("evil\r\nx-injected: 1") == b"" and objective_header(None) == b""


async def test_each_request_names_its_objective(tiny_model_dir: Path) -> None:
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
    settings = GatewaySettings(  # type: ignore[call-arg]
        model=tiny_model_dir, key_pepper="k" * 8 + "abcdefghijklmnopqrstuvwx",
        salt_secret="s" * 8 + "zyxwvutsrqponmlkjihgfedc", engine_mode="http",
        engine_urls=[f"http://127.0.0.1:{port}"], engine_objective_prefix="lg-",
    )  # fmt: skip
    client = HttpEngineClient.from_settings(settings)
    try:
        for priority in (0, 15, 25):
            request = GenerateRequest(request_id=f"r{priority}", token_ids=[1, 2],
                                      sampling_params=GenerateSamplingParams(max_tokens=1),
                                      priority=priority)  # fmt: skip
            stream = await client.open(request, None)
            assert [e.choices[0].token_ids async for e in stream] == [[5]]
            await stream.aclose()
    finally:
        await client.close()
        server.close()
    names = [
        line.split(b": ", 1)[1] for head in heads for line in head.split(b"\r\n")
        if line.startswith(b"x-gateway-inference-objective")
    ]  # fmt: skip
    assert names == [b"lg-realtime", b"lg-standard", b"lg-batch"]

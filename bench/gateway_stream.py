"""Streaming through the gateway (issue 48, acceptance 3): what the gateway adds to the time to a
stream's first byte, and to each chunk after it, for bench/gateway_overhead.py.

wrk times whole responses; a stream's first byte needs a client that reads as the bytes come.
Each request goes over a raw keep-alive socket (a Python HTTP client would cost more than the
gateway): the time from sending the request to the first byte of the body (TTFB), and to the
last. 64-token streams, the stand-in sending one SSE event per token (bench/gateway_standin.py),
so the gateway relays 64 chunks. One connection for the latencies (requests back to back), then
16 connections at once for the per-chunk cost under load. "Added" is via the gateway minus the
stand-in direct; per chunk is the added whole-stream time over the 64 chunks.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

STREAM_TOKENS = 64
BODY = {
    "token_ids": list(range(100, 132)),
    "sampling_params": {"max_tokens": STREAM_TOKENS, "temperature": 0},
    "stream": True,
}


@dataclass(frozen=True)
class StreamTimes:
    ttfb_ms: list[float]
    total_ms: list[float]


async def _read_response(reader: asyncio.StreamReader) -> tuple[float | None, int]:
    """Read one chunked response; (when its first body byte came, its status)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    first: float | None = None
    chunked = b"transfer-encoding: chunked" in head.lower()
    if not chunked:  # an error answer: a plain body
        length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                       if line.startswith(b"content-length:")), 0)  # fmt: skip
        await reader.readexactly(length)
        return None, status
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        if first is None:
            first = time.perf_counter()
        await reader.readexactly(size + 2)
        if size == 0:
            return first, status


async def _client(url: str, key: str | None, count: int, times: StreamTimes) -> None:
    parsed = urlparse(url)
    reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
    body = json.dumps(BODY).encode()
    auth = f"authorization: Bearer {key}\r\n".encode() if key else b""
    request = (
        b"POST /inference/v1/generate HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        + auth
        + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip
    try:
        for _ in range(count):
            sent = time.perf_counter()
            writer.write(request)
            first, status = await _read_response(reader)
            done = time.perf_counter()
            if status != 200 or first is None:
                raise RuntimeError(f"{url}: a stream answered {status}")
            times.ttfb_ms.append((first - sent) * 1000)
            times.total_ms.append((done - sent) * 1000)
    finally:
        writer.close()


def measure_streams(url: str, key: str | None, *, connections: int, requests: int) -> StreamTimes:
    times = StreamTimes([], [])

    async def run() -> None:
        per = max(1, requests // connections)
        await asyncio.gather(*(_client(url, key, per, times) for _ in range(connections)))

    asyncio.run(run())
    return times


def stream_report(
    targets: dict[str, tuple[str, str | None]], *, rounds: int, requests: int
) -> dict[str, Any]:
    """`targets`: "direct" and "via" (url, key), and "baseline" (another gateway: the code of
    `--baseline-src`) when given. Interleaved rounds; medians over the rounds of each round's
    p50."""
    p50: dict[str, dict[str, list[float]]] = {
        name: {"ttfb_1": [], "total_1": [], "total_16": []} for name in targets
    }
    for url, key in targets.values():  # warm-up
        measure_streams(url, key, connections=4, requests=16)
    for _ in range(rounds):
        for name, (url, key) in targets.items():
            one = measure_streams(url, key, connections=1, requests=requests)
            many = measure_streams(url, key, connections=16, requests=requests * 4)
            p50[name]["ttfb_1"].append(statistics.median(one.ttfb_ms))
            p50[name]["total_1"].append(statistics.median(one.total_ms))
            p50[name]["total_16"].append(statistics.median(many.total_ms))
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in p50.items()}
    report: dict[str, Any] = {
        "tokens": STREAM_TOKENS,
        **_added(med["via"], med["direct"]),
        "p50_ms": {name: {k: round(v, 3) for k, v in d.items()} for name, d in med.items()},
    }
    if "baseline" in med:
        base = _added(med["baseline"], med["direct"])
        report["baseline"] = base
        if base["added_ttfb_ms"]["p50"] > 0:
            ratio = report["added_ttfb_ms"]["p50"] / base["added_ttfb_ms"]["p50"]
            report["ratio_added_ttfb_p50"] = round(ratio, 3)
    return report


def _added(via: dict[str, float], direct: dict[str, float]) -> dict[str, Any]:
    """What a gateway adds to the stand-in alone: to the first byte, and per chunk."""
    return {
        "added_ttfb_ms": {"p50": round(via["ttfb_1"] - direct["ttfb_1"], 3)},
        "added_per_chunk_ms": {
            "c1": round((via["total_1"] - direct["total_1"]) / STREAM_TOKENS, 4),
            "c16": round((via["total_16"] - direct["total_16"]) / STREAM_TOKENS, 4),
        },
    }

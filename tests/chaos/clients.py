"""Impolite clients for the chaos tests: each one streams a chat completion and hangs up the way
real clients do (the official OpenAI SDK breaking out at `[DONE]`, an httpx stream left right
after `[DONE]`, a raw socket closed at an arbitrary byte), and reports what it saw.

Nothing here is polite on purpose: no draining, no waiting for the end of the chunked body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import struct
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai

from engine.protocol import tenant_label

MODEL = "tiny"
DONE_LINE = "data: [DONE]"
CLIENT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Seen:
    """What a client that read up to `[DONE]` saw: the response id (the ledger's request id),
    the usage chunk, and the last finish reason of its choice."""

    request_id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    finish_reason: str | None


def chat_body(index: int, max_tokens: int) -> dict[str, Any]:
    """A streamed chat request; `ignore_eos` makes the engine produce exactly `max_tokens`."""
    return {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": f"Client {index}: " + "tell me more. " * (index % 7)}
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def _sdk_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": body["model"],
        "messages": body["messages"],
        "max_tokens": body["max_tokens"],
        "temperature": body["temperature"],
        "stream": True,
        "stream_options": body["stream_options"],
        "extra_body": {"ignore_eos": body["ignore_eos"]},
    }


def _seen_from_sdk(chunks: list[Any]) -> Seen:
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1, f"expected exactly one usage chunk, got {len(usage)}"
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    details = usage[0].prompt_tokens_details
    return Seen(
        request_id=chunks[0].id,
        prompt_tokens=usage[0].prompt_tokens,
        completion_tokens=usage[0].completion_tokens,
        cached_tokens=details.cached_tokens if details is not None else None,
        finish_reason=next((r for r in reversed(reasons) if r is not None), None),
    )


def sdk_sync_stream(client: openai.OpenAI, body: dict[str, Any]) -> Seen:
    """The sync SDK: iterate to the end; the SDK breaks out at `[DONE]` and closes the
    response without reading the rest of the body."""
    stream = client.chat.completions.create(**_sdk_kwargs(body))
    return _seen_from_sdk(list(stream))


async def sdk_async_stream(client: openai.AsyncOpenAI, body: dict[str, Any]) -> Seen:
    """The async SDK, the same."""
    stream = await client.chat.completions.create(**_sdk_kwargs(body))
    return _seen_from_sdk([chunk async for chunk in stream])


def _seen_from_events(events: list[dict[str, Any]]) -> Seen:
    usage = [e["usage"] for e in events if e.get("usage")]
    assert len(usage) == 1, f"expected exactly one usage chunk, got {len(usage)}"
    reasons = [e["choices"][0].get("finish_reason") for e in events if e.get("choices")]
    details = usage[0].get("prompt_tokens_details") or {}
    return Seen(
        request_id=events[0]["id"],
        prompt_tokens=usage[0]["prompt_tokens"],
        completion_tokens=usage[0]["completion_tokens"],
        cached_tokens=details.get("cached_tokens"),
        finish_reason=next((r for r in reversed(reasons) if r is not None), None),
    )


async def httpx_stream(client: httpx.AsyncClient, url: str, key: str, body: dict[str, Any]) -> Seen:
    """An httpx stream left (closing the connection) as soon as `data: [DONE]` arrives."""
    headers = {"authorization": f"Bearer {key}"}
    events: list[dict[str, Any]] = []
    done = False
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, r.status_code
        async for line in r.aiter_lines():
            if line == DONE_LINE:
                done = True
                break  # leaving the block closes the connection, the body not read to its end
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    assert done, "the stream ended without [DONE]"
    return _seen_from_events(events)


# ---- raw sockets --------------------------------------------------------------------------------


def raw_request(url: str, key: str, body: dict[str, Any]) -> bytes:
    """A hand-written HTTP/1.1 POST of a streamed chat completion (`Connection: close`)."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\n"
        f"Host: {parts.netloc}\r\n"
        f"Authorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\n"
        f"Accept: text/event-stream\r\n"
        f"Content-Length: {len(payload)}\r\n"
        f"Connection: close\r\n"
        f"\r\n"
    )
    return head.encode() + payload


@dataclass(frozen=True)
class RawOutcome:
    """What a raw socket read before it hung up."""

    received: bytes
    reset: bool  # closed with SO_LINGER 0: the gateway sees a reset, not a FIN

    @property
    def got_headers(self) -> bool:
        return self.received.startswith(b"HTTP/1.1 200") and b"\r\n\r\n" in self.received

    @property
    def response_ids(self) -> set[str]:
        """Response ids seen in the (possibly cut) body: the ledger's request ids."""
        return {m.decode() for m in re.findall(rb'"id":\s*"(chatcmpl-[0-9a-f]+)"', self.received)}

    @property
    def got_done(self) -> bool:
        return b"data: [DONE]" in self.received

    def usage(self) -> dict[str, Any] | None:
        """The usage chunk, if it arrived whole (de-chunking is not needed: the event is on one
        line, and a transfer-chunk boundary inside it would only make this return None)."""
        for line in self.received.split(b"\n"):
            if line.startswith(b"data: {") and b'"usage"' in line:
                with contextlib.suppress(ValueError):
                    usage = json.loads(line[6:])["usage"]
                    if usage:
                        return dict(usage)
        return None


async def raw_socket(
    url: str, request: bytes, *, send_bytes: int, read_bytes: int, reset: bool
) -> RawOutcome:
    """Send the first `send_bytes` of `request`, read until `read_bytes` have arrived (or the
    gateway closed), then close: with a FIN, or with a reset when `reset`."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    received = bytearray()
    async with asyncio.timeout(CLIENT_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            writer.write(request[:send_bytes])
            await writer.drain()
            while len(received) < read_bytes:
                chunk = await reader.read(min(65536, read_bytes - len(received)))
                if not chunk:
                    break
                received += chunk
        finally:
            if reset:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return RawOutcome(received=bytes(received), reset=reset)


# ---- the gateway's own counters -----------------------------------------------------------------


def gateway_counter(url: str, name: str, tenant_id: str) -> float:
    """A gateway counter (e.g. `loragate_gateway_requests_total`) for one tenant, summed."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and f'tenant="{tenant_label(tenant_id)}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total

"""Server-sent events to clients, noticing clients that leave, and responses that finish the
request's bookkeeping once they are sent.

`EventStreamResponse` sends the events of an async iterator while listening for the client's
disconnect; whichever way the stream ends (done, error, client gone), the iterator is closed,
so its `finally` (abort the engine request, settle the quota, record usage) always runs. While
the engine is silent (a queued request), a `: keep-alive` comment goes out every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

SSE_DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"


def sse(payload: Mapping[str, Any]) -> bytes:
    """One event; compact JSON never holds a raw newline, so the framing is safe."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class ClientGone(Exception):
    """The client disconnected before the response started."""


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (its `finally` runs) if the client leaves first."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
        if not work_task.done():
            work_task.cancel()
            await asyncio.gather(work_task, return_exceptions=True)
    if work_task.cancelled():
        raise ClientGone()
    return work_task.result()


class FinishingResponse(Response):
    """A whole JSON response; `on_sent` runs after the body went out (off the client's critical
    path), and also when sending fails, so the request is always finished exactly once."""

    media_type = "application/json"

    def __init__(
        self, body: bytes, *, headers: Mapping[str, str], on_sent: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(body, headers=dict(headers), media_type=self.media_type)
        self._on_sent = on_sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_sent()


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        first: list[bytes],
        events: AsyncGenerator[bytes, None],
        *,
        headers: Mapping[str, str],
        keepalive_s: float,
    ) -> None:
        # No body: init_headers then sets no content-length (the length is unknown).
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no", **headers})
        self._first = first
        self._events = events
        self._keepalive_s = keepalive_s

    async def _produce(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        for chunk in self._first:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        iterator = self._events.__aiter__()
        while True:
            next_item = asyncio.ensure_future(iterator.__anext__())
            try:
                while True:
                    done, _ = await asyncio.wait({next_item}, timeout=self._keepalive_s)
                    if done:
                        break
                    await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
            except BaseException:
                next_item.cancel()
                with contextlib.suppress(BaseException):
                    await next_item
                raise
            try:
                chunk = next_item.result()
            except StopAsyncIteration:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        produce = asyncio.ensure_future(self._produce(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({produce, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (produce, watch):
                task.cancel()
            await asyncio.gather(produce, watch, return_exceptions=True)
            with anyio.CancelScope(shield=True):
                await self._events.aclose()
        if produce.done() and not produce.cancelled() and produce.exception() is not None:
            exc = produce.exception()
            if not isinstance(exc, OSError):  # a send to a closed socket is a disconnect
                raise exc  # type: ignore[misc]

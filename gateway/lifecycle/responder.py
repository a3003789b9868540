"""The HTTP side of a `Run`: one whole-or-streamed responder for every inference route.

It waits for the run's answer while listening for the client's disconnect. Streaming waits for
the first engine event before sending headers, so every error that can happen before the first
token (quota, engine rejection, every replica down) is a proper HTTP status; after that, bytes
come from the run's `events` until its `None`, with a `: keep-alive` comment whenever the
engine has been silent for `keepalive_s` (a queued request).

However this side ends (done, the client gone, a broken socket, its task cancelled), it tells
the run with `client_gone()`, which is synchronous and idempotent: the run, in its own task,
stops the engine and keeps the books. Nothing here awaits bookkeeping.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.errors import ClientGone
from gateway.lifecycle.run import Run

KEEPALIVE = b": keep-alive\n\n"


async def respond(request: Request, run: Run, *, keepalive_s: float) -> Response:
    watch: asyncio.Future[None] = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait((run.answer, watch), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        run.client_gone()  # this task was cancelled; the run is not
        raise
    finally:
        watch.cancel()
    if not run.answer.done():
        run.client_gone()
        raise ClientGone()
    first = run.answer.result()  # raises the run's error: its HTTP status
    headers = response_headers(run)
    if not run.is_streamed:
        return Response(first, headers=headers, media_type="application/json")
    return EventStreamResponse(run, first, headers=headers, keepalive_s=keepalive_s)


def response_headers(run: Run) -> dict[str, str]:
    headers = run.admission.rate.headers() if run.admission is not None else {}
    overhead = max(0.0, time.perf_counter() - run.started - run.engine_wait_s)
    headers["x-loragate-overhead-ms"] = f"{overhead * 1000:.3f}"
    return headers


async def _disconnected(receive: Receive) -> None:
    # The body has been read in full by now, so the next message can only be the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


class EventSource(Protocol):
    """What the streamed response needs of a run."""

    events: asyncio.Queue[bytes | None]

    def client_gone(self) -> None: ...


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self, run: EventSource, first: bytes, *, headers: dict[str, str], keepalive_s: float
    ) -> None:
        # No body: init_headers then sets no content-length (the length is unknown).
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no", **headers})
        self._run = run
        self._first = first
        self._keepalive_s = keepalive_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run = self._run
        watch = asyncio.ensure_future(_disconnected(receive))
        watch.add_done_callback(lambda _: run.client_gone())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if self._first:
                await send({"type": "http.response.body", "body": self._first, "more_body": True})
            while not watch.done():
                try:
                    async with asyncio.timeout(self._keepalive_s):
                        chunk = await run.events.get()
                except TimeoutError:
                    chunk = KEEPALIVE
                if chunk is None:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # a send to a closed socket: the client is gone (client_gone below)
        finally:
            watch.cancel()
            run.client_gone()

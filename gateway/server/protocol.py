"""uvicorn's HTTP protocols (h11 and httptools) wired to the connection guard (gateway/server/
guard.py: head and body deadlines, connections per client). Each subclass only translates its
parser's events into the guard's four; the limits themselves live in the guard, so they hold
whichever parser serves (`LORAGATE_HTTP_PARSER`). Both are module-level classes: `--workers N`
pickles uvicorn's config, protocol class included, into each worker."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.server.guard import ConnectionGuard, ConnectionLimits


def _new_guard(
    protocol: Any, limits: ConnectionLimits, transport: asyncio.Transport
) -> ConnectionGuard:
    def response_started() -> bool:
        return protocol.cycle is not None and bool(protocol.cycle.response_started)

    return ConnectionGuard(limits, protocol.loop, transport, response_started)


def _host(protocol: Any) -> str:
    return protocol.client[0] if protocol.client else "unknown"


class _Guarded:
    """The connection's two ends, the same for every parser: a mixin ahead of uvicorn's protocol
    class (`class X(_Guarded, H11Protocol)`), whose connection_made / connection_lost it wraps."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._guard: ConnectionGuard | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        guard = _new_guard(self, self._limits, cast(asyncio.Transport, transport))
        self._guard = guard if guard.opened(_host(self)) else None

    def _in_head(self) -> bool:
        return self._guard is not None and self._guard.phase == "head"

    def _read_in_head(self, num_bytes: int) -> None:
        """A read that began inside a head has been parsed (the guard counts it if the head
        goes on past it)."""
        if self._guard is not None:
            self._guard.read_within_head(num_bytes)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._guard is not None:
            self._guard.closed()
        super().connection_lost(exc)  # type: ignore[misc]


class GuardedH11Protocol(_Guarded, H11Protocol):
    def data_received(self, data: bytes) -> None:
        if self._guard is not None and self.conn.their_state is h11.IDLE:
            self._guard.request_begun()
        in_head = self._in_head()
        super().data_received(data)
        self._follow()
        if in_head:
            self._read_in_head(len(data))

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        """h11 reports states, not events: move the deadline along with them."""
        if self._guard is None:
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY and self._guard.phase == "head":
            self._guard.head_read()
        elif state not in (h11.IDLE, h11.SEND_BODY) and self._guard.phase:
            self._guard.body_read()


class GuardedHttpToolsProtocol(_Guarded, HttpToolsProtocol):
    def data_received(self, data: bytes) -> None:
        in_head = self._in_head()
        super().data_received(data)
        if in_head:
            self._read_in_head(len(data))

    # llhttp's callbacks, in the order of a request: its first byte, its head, its body.
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._guard is not None:
            self._guard.request_begun()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self._guard is not None:
            self._guard.head_read()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._guard is not None:
            self._guard.body_read()

"""uvicorn's h11 protocol with the limits a server facing clients needs and uvicorn lacks.

uvicorn bounds idle keep-alive connections, but not how long a client may take to send a request
head or body, nor how many connections one client holds: a client dribbling header bytes keeps
its connection (and a slot of the process) forever, and a few thousand of them starve everyone
else. Here:

- the request head must arrive within `header_timeout_s` of its first byte (of the connection,
  for the first request), and the body within `body_timeout_s` of the head; past that the
  client gets a 408 (if nothing was sent yet) and the connection closes;
- one client address holds at most `max_per_client` connections; more are closed at once.

A reverse proxy in front (nginx `client_header_timeout`, `client_body_timeout`, `limit_conn`)
should enforce its own limits too: these are the last line, per process.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

_TIMEOUT_BODY = json.dumps(
    {
        "error": {
            "message": "The request was not received in time.",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_timeout",
        }
    }
).encode()
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY
)


@dataclass
class ConnectionLimits:
    """Per process (each worker gets its own copy): the limits and the live count per client."""

    header_timeout_s: float
    body_timeout_s: float
    max_per_client: int
    open_by_client: Counter[str] = field(default_factory=Counter)


class GuardedH11Protocol(H11Protocol):
    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._deadline: asyncio.TimerHandle | None = None
        self._phase = ""  # "head" or "body" while a deadline runs
        self._counted: str | None = None  # the client address this connection counts for

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        host = self.client[0] if self.client else "unknown"
        if self._limits.open_by_client[host] >= self._limits.max_per_client:
            log.info("closed a connection: %s holds %d already", host, self._limits.max_per_client)
            transport.close()
            return
        self._limits.open_by_client[host] += 1
        self._counted = host
        self._arm("head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted is not None:
            self._limits.open_by_client[self._counted] -= 1
            if self._limits.open_by_client[self._counted] <= 0:
                del self._limits.open_by_client[self._counted]
            self._counted = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._deadline is None:
            self._arm("head")  # the first bytes of a new request on a kept-alive connection
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        """Move the deadline along with the request: head -> body -> none."""
        state = self.conn.their_state
        if state is h11.SEND_BODY and self._phase == "head":
            self._arm("body")
        elif state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()

    def _arm(self, phase: str) -> None:
        self._disarm()
        timeout = self._limits.header_timeout_s if phase == "head" else self._limits.body_timeout_s
        self._phase = phase
        self._deadline = self.loop.call_later(timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = ""

    def _expired(self) -> None:
        phase, self._deadline = self._phase, None
        if self.transport.is_closing():
            return
        log.info("closed a connection: the request %s was not received in time", phase)
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()

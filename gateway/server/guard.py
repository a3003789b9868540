"""The limits a server facing clients needs and uvicorn lacks, apart from any HTTP parser.

uvicorn bounds idle keep-alive connections, but not how long a client may take to send a request
head or body, nor how many connections one client holds: a client dribbling header bytes keeps
its connection (and a slot of the process) forever, and a few thousand of them starve everyone
else. Here:

- the request head must arrive within `header_timeout_s` of its first byte (of the connection,
  for the first request), and the body within `body_timeout_s` of the head; past that the
  client gets a 408 (if nothing was sent for that request yet) and the connection closes;
- one client address holds at most `max_per_client` connections; more are closed at once;
- a request head (request line and headers) holds at most `max_header_bytes`; past that the
  client gets a 431 and the connection closes. h11 bounds its buffer itself, httptools does
  not: it gathers a header's value by concatenating bytes, so one fast client could send
  megabytes of a single header within the head's deadline and have the worker copy them over
  and over.

A `ConnectionGuard` follows one connection through four events (opened, a request's first byte,
its head read, its body read) that every parser reports in its own way; gateway/server/
protocol.py wires uvicorn's h11 and httptools protocols to it. A reverse proxy in front (nginx
`client_header_timeout`, `client_body_timeout`, `limit_conn`) should enforce its own limits too:
these are the last line, per process.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


def closing_response(status: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error answer, written straight to the transport before it closes (the
    request never reached the app), in the API's error shape."""
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )


TIMEOUT_RESPONSE = closing_response(
    "408 Request Timeout", "The request was not received in time.", "request_timeout"
)


@dataclass
class ConnectionLimits:
    """Per process (each worker gets its own copy): the limits and the live count per client."""

    header_timeout_s: float
    body_timeout_s: float
    max_per_client: int
    max_header_bytes: int = 32 * 1024
    open_by_client: Counter[str] = field(default_factory=Counter)


class ConnectionGuard:
    """One connection's deadline (none, "head" or "body") and its place in the per-client count.
    `response_started` says whether the request being read has been answered already (an app
    may answer before reading the body): then a late body closes without a 408."""

    def __init__(
        self,
        limits: ConnectionLimits,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport,
        response_started: Callable[[], bool],
    ) -> None:
        self._limits = limits
        self._loop = loop
        self._transport = transport
        self._response_started = response_started
        self._deadline: asyncio.TimerHandle | None = None
        self.phase = ""  # "head" or "body" while a deadline runs
        self._head_bytes = 0  # of the head being read
        self._counted: str | None = None  # the client address this connection counts for

    def opened(self, host: str) -> bool:
        """Count the connection for `host` and start the first head's deadline; False (and the
        transport closed) when `host` holds its share already."""
        if self._limits.open_by_client[host] >= self._limits.max_per_client:
            log.info("closed a connection: %s holds %d already", host, self._limits.max_per_client)
            self._transport.close()
            return False
        self._limits.open_by_client[host] += 1
        self._counted = host
        self._arm("head")
        return True

    def request_begun(self) -> None:
        """The first bytes of a request: on a kept-alive connection its head's deadline starts
        here (the first request's started when the connection opened)."""
        if self._deadline is None:
            self._arm("head")

    def head_read(self) -> None:
        self._arm("body")

    def read_within_head(self, num_bytes: int) -> None:
        """After a read of `num_bytes` that began inside a head: if the head goes on past it,
        all of them were the head's; past `max_header_bytes` the client gets a 431 and the
        connection closes. A read that begins a head is not counted, so the bound holds to
        within one read (at most 256 KiB)."""
        if self.phase != "head":
            return
        self._head_bytes += num_bytes
        if self._head_bytes <= self._limits.max_header_bytes or self._transport.is_closing():
            return
        log.info("closed a connection: a request head over %d bytes", self._limits.max_header_bytes)
        self._disarm()
        self._transport.write(
            closing_response(
                "431 Request Header Fields Too Large",
                f"The request head is larger than {self._limits.max_header_bytes} bytes.",
                "request_header_fields_too_large",
            )
        )
        self._transport.close()

    def body_read(self) -> None:
        self._disarm()

    def closed(self) -> None:
        self._disarm()
        if self._counted is not None:
            self._limits.open_by_client[self._counted] -= 1
            if self._limits.open_by_client[self._counted] <= 0:
                del self._limits.open_by_client[self._counted]
            self._counted = None

    def _arm(self, phase: str) -> None:
        self._disarm()
        timeout = self._limits.header_timeout_s if phase == "head" else self._limits.body_timeout_s
        self.phase = phase
        self._head_bytes = 0
        self._deadline = self._loop.call_later(timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.phase = ""

    def _expired(self) -> None:
        phase, self._deadline = self.phase, None
        if self._transport.is_closing():
            return
        log.info("closed a connection: the request %s was not received in time", phase)
        # While a head is read no answer to it can have started (an earlier request's may have).
        if phase == "head" or not self._response_started():
            self._transport.write(TIMEOUT_RESPONSE)
        self._transport.close()

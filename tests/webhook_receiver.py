"""A real webhook receiver for the alert tests: an HTTP server on a loopback port, in a thread
of its own, that records every request it gets and answers with the statuses it is told to
(then 200), as a tenant's endpoint would. It verifies nothing itself: the tests do, with the
secret the admin API returned."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() on arrival
    answered: int

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


class Receiver:
    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])  # answered in order, then 200
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self.url = ""

    def _answer(self) -> int:
        with self._lock:
            return self.statuses.pop(0) if self.statuses else 200

    async def wait_for(self, count: int, timeout_s: float = 20.0) -> list[Received]:
        """Waits without blocking the event loop (the gateway's sender runs on it)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.received) >= count:
                    return list(self.received)
            await asyncio.sleep(0.02)
        raise AssertionError(f"expected {count} webhook requests, got {len(self.received)}")


@contextmanager
def webhook_receiver(statuses: list[int] | None = None) -> Iterator[Receiver]:
    receiver = Receiver(statuses)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            status = receiver._answer()
            with receiver._lock:
                receiver.received.append(
                    Received(
                        path=self.path,
                        headers={k.lower(): v for k, v in self.headers.items()},
                        body=body,
                        at=time.monotonic(),
                        answered=status,
                    )
                )
            self.send_response(status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/loragate"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

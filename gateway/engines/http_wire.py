"""A small HTTP/1.1 client for the hot path to engine replicas: pooled keep-alive connections,
one write per request, streamed bodies (Content-Length or chunked).

Why not httpx here: per request it costs several times the CPU of this module and writes the
headers and the body separately; on the gateway's hot path (every inference request) that was
the largest single cost. Control-path calls (health, models, adapter loads, aborts) still use
httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from gateway.engines.http_chunked import ChunkedDecoder

_MAX_HEAD_BYTES = 64 * 1024
_MAX_LINE_BYTES = 16 * 1024 * 1024  # one SSE event (a chunk of many tokens with logprobs)


class WireError(OSError):
    """The connection failed or the peer spoke something other than HTTP/1.1."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Response:
    def __init__(self, pool: Pool, conn: Connection, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers
        self._pool = pool
        self._conn: Connection | None = conn
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._remaining = int(length) if length is not None and not self._chunked else None
        self._keep_alive = headers.get("connection", "").lower() != "close" and (
            self._chunked or self._remaining is not None
        )
        self._complete = False

    async def _chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        reader = conn.reader
        try:
            if self._chunked:
                decoder = ChunkedDecoder()
                while not decoder.done:
                    data = await reader.read(65536)
                    if not data:
                        raise WireError("the engine closed the connection mid-body")
                    decoder.feed(data)
                    if first := decoder.take(1):
                        yield first
                    if rest := decoder.take():
                        yield rest
                if decoder.leftover:  # more than the body: the connection is not reusable
                    self._keep_alive = False
            elif self._remaining is not None:
                while self._remaining > 0:
                    data = await reader.read(min(self._remaining, 65536))
                    if not data:
                        raise WireError("the engine closed the connection mid-body")
                    self._remaining -= len(data)
                    yield data
            else:
                while data := await reader.read(65536):
                    yield data
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise WireError("the engine sent a malformed body") from exc
        except OSError as exc:
            raise WireError("the engine connection failed") from exc
        self._complete = True

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self._chunks()])

    async def data_lines(self) -> AsyncIterator[str]:
        """The payloads of the body's `data:` lines (SSE framing), decoded as UTF-8. Blank
        separators and comments are skipped here, so a reader resumes once an event."""
        pending = b""
        async for chunk in self._chunks():
            pending += chunk
            if len(pending) > _MAX_LINE_BYTES:
                raise WireError("the engine sent an oversized event")
            *complete, pending = pending.split(b"\n")
            for line in complete:
                if line.startswith(b"data: "):
                    yield line[6:].rstrip(b"\r").decode("utf-8", errors="replace")
        if pending.startswith(b"data: "):
            yield pending[6:].decode("utf-8", errors="replace")

    def close(self) -> None:
        """Return the connection to the pool if the body was read to its end; else drop it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._complete and self._keep_alive:
            self._pool.release(conn)
        else:
            conn.close()


class Pool:
    """Keep-alive connections to one origin (scheme://host:port)."""

    def __init__(self, url: str, *, connect_timeout_s: float, max_idle: int = 64) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        self._host_header = parts.netloc.encode()
        self._connect_timeout_s = connect_timeout_s
        self._max_idle = max_idle
        self._idle: list[Connection] = []

    async def _connect(self) -> Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self._host,
                    self._port,
                    ssl=ssl.create_default_context() if self._tls else None,
                    limit=_MAX_LINE_BYTES,
                ),
                self._connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise WireError("could not connect to the engine") from exc
        return Connection(reader, writer)

    def release(self, conn: Connection) -> None:
        if len(self._idle) < self._max_idle and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    async def post(
        self, path: str, body: bytes, *, content_type: str, headers: bytes = b""
    ) -> Response:
        """Send one request; a stale pooled connection is retried once on a fresh one.
        `headers`: extra header lines, each ending in CRLF, from trusted configuration only."""
        head = (
            b"POST " + path.encode() + b" HTTP/1.1\r\nhost: " + self._host_header
            + b"\r\ncontent-type: " + content_type.encode()
            + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n" + headers + b"\r\n"
        )  # fmt: skip
        while self._idle:
            conn = self._idle.pop()
            try:
                return await self._exchange(conn, head + body)
            except WireError:
                conn.close()  # the engine closed an idle connection: try the next one
        conn = await self._connect()
        try:
            return await self._exchange(conn, head + body)
        except WireError:
            conn.close()
            raise

    async def _exchange(self, conn: Connection, request: bytes) -> Response:
        try:
            conn.writer.write(request)
            head = await conn.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
            raise WireError("the engine connection failed") from exc
        if len(head) > _MAX_HEAD_BYTES:
            raise WireError("the engine sent oversized headers")
        lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError) as exc:
            raise WireError("the engine did not answer in HTTP/1.1") from exc
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return Response(self, conn, status, headers)

"""One Redis connection that carries every quota command of the process at once (pipelining).

redis-py checks a connection out of a blocking pool for each command, packs it through several
layers and hands it back: about 115 us of the gateway's CPU per command in a same-run comparison
(bench/quota_client.py), against about 20 us here, and a
request makes two (admission and settlement): a fifth of a gateway request's CPU (issue 48).
Redis answers one connection's commands in order, so a single connection can carry them all:
each call writes its command and waits on a future, and the reader resolves the futures in order
as replies arrive (the design of aioredis 1.x and of hiredis's async clients). Concurrent callers
never wait for a connection. Commands issued in the same turn of the event loop leave in one
`write` at the end of that turn: under load several requests' admissions and settlements share
a system call (at one request in flight the turn ends at once, so nothing waits).

Failures, the same as `make_redis`'s client promises (tenancy/redis_client.py):
- A connection that breaks fails every command in flight with `ConnectionError`; the next call
  connects again. A command that failed that way is sent again after a short backoff, at most
  `RECONNECT_RETRIES` times: after a Redis restart the first command succeeds instead of a 503.
  A command Redis may have run before its reply was lost is safe to send again: the admission
  script answers a replayed request id with the admission it already made, settlement and
  SET/GET are idempotent.
- A command unanswered after `timeout_s` closes the connection (a late reply would otherwise be
  read as the next command's) and fails with redis-py's `TimeoutError`, as does everything behind it (not sent again: Redis is
  slow or gone, and a prompt 503 beats a second wait). One
  watchdog per connection checks the oldest command, so a command carries no timer of its own.
- Error replies raise redis-py's exception types (`NoScriptError`, `AuthenticationError`,
  `ResponseError`), so callers handle them as before.

Single servers only (`redis://` and `rediss://`, with user, password and database from the URL):
a cluster keeps redis-py's cluster client, which routes by slot.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from typing import cast
from urllib.parse import unquote, urlsplit

from redis.exceptions import (
    AuthenticationError,
    ConnectionError,
    NoScriptError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeout

from tenancy.redis_client import RECONNECT_BACKOFF_S, RECONNECT_RETRIES

Reply = int | bytes | list["Reply"] | None


def pack(args: tuple[bytes | str | int | float, ...]) -> bytes:
    """A command in RESP: an array of bulk strings (numbers as their text)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class _Incomplete(Exception):
    """The buffer ends inside a reply: wait for more bytes."""


def _error(message: str) -> Exception:
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message)
    if message.startswith(("NOAUTH", "WRONGPASS")):
        return AuthenticationError(message)
    return ResponseError(message)


def parse(buf: bytearray, pos: int) -> tuple[Reply | Exception, int]:
    """One RESP2 reply from `buf` at `pos`: (value, position after it). An error reply is
    returned as an exception (raised by the caller whose command it answers)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    line = bytes(buf[pos + 1 : end])
    pos = end + 2
    if kind == 58:  # ':' integer
        return int(line), pos
    if kind == 36:  # '$' bulk string
        size = int(line)
        if size < 0:
            return None, pos
        if len(buf) < pos + size + 2:
            raise _Incomplete
        return bytes(buf[pos : pos + size]), pos + size + 2
    if kind == 42:  # '*' array
        count = int(line)
        if count < 0:
            return None, pos
        items: list[Reply] = []
        for _ in range(count):
            item, pos = parse(buf, pos)
            if isinstance(item, Exception):  # an error inside a script's table
                return item, pos
            items.append(item)
        return items, pos
    if kind == 43:  # '+' simple string
        return line, pos
    if kind == 45:  # '-' error
        return _error(line.decode(errors="replace")), pos
    raise ConnectionError(f"unreadable Redis reply type {chr(kind)!r}")


class _Connection(asyncio.Protocol):
    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._waiting: collections.deque[tuple[float, asyncio.Future[Reply]]] = collections.deque()
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._outgoing: list[bytes] = []  # commands of this loop turn, written by _flush
        self.is_closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is not a subclass of asyncio.Transport, but has its methods.
        self._transport = cast(asyncio.Transport, transport)

    def send(self, payload: bytes) -> asyncio.Future[Reply]:
        if self.is_closed or self._transport is None:
            raise ConnectionError("the Redis connection is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._waiting.append((time.monotonic(), future))
        if not self._outgoing:
            loop.call_soon(self._flush)
        self._outgoing.append(payload)
        if self._watchdog is None:
            self._watchdog = loop.call_later(self._timeout_s, self._check_oldest)
        return future

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        if not self.is_closed and self._transport is not None:  # closed: their futures failed
            self._transport.write(outgoing[0] if len(outgoing) == 1 else b"".join(outgoing))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        pos = 0
        try:
            while self._waiting and pos < len(self._buffer):
                value, pos_after = parse(self._buffer, pos)
                pos = pos_after
                _, future = self._waiting.popleft()
                if future.done():  # its caller was cancelled: the reply is dropped
                    continue
                if isinstance(value, Exception):
                    future.set_exception(value)
                else:
                    future.set_result(value)
        except _Incomplete:
            pass
        except ConnectionError as exc:
            self.close(exc)
            return
        del self._buffer[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(ConnectionError(f"the Redis connection was lost: {exc or 'closed'}"))

    def close(self, exc: Exception) -> None:
        self._fail_all(exc)
        if self._transport is not None:
            self._transport.close()

    def _fail_all(self, exc: Exception) -> None:
        self.is_closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        while self._waiting:
            _, future = self._waiting.popleft()
            if not future.done():
                future.set_exception(exc)

    def _check_oldest(self) -> None:
        self._watchdog = None
        if not self._waiting or self.is_closed:
            return
        age = time.monotonic() - self._waiting[0][0]
        if age >= self._timeout_s:
            self.close(RedisTimeout(f"Redis did not answer within {self._timeout_s:g} s"))
            return
        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_later(self._timeout_s - age, self._check_oldest)


class PipelinedRedis:
    """The commands the quota store uses (EVALSHA, SCRIPT LOAD, SET, GET) on one pipelined
    connection; see the module's docstring."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"PipelinedRedis takes redis:// or rediss:// URLs, not {url!r}")
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 6379
        self._ssl = ssl.create_default_context() if parts.scheme == "rediss" else None
        self._username = unquote(parts.username) if parts.username else None
        self._password = unquote(parts.password) if parts.password else None
        path = parts.path.lstrip("/")
        self._db = int(path) if path else 0
        self._timeout_s = timeout_s
        self._connection: _Connection | None = None
        self._connecting = asyncio.Lock()

    async def _connect(self) -> _Connection:
        connection = self._connection
        if connection is not None and not connection.is_closed:
            return connection
        async with self._connecting:  # one connect for every caller that found it closed
            connection = self._connection
            if connection is not None and not connection.is_closed:
                return connection
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self._timeout_s):
                    _, connection = await loop.create_connection(
                        lambda: _Connection(self._timeout_s), self._host, self._port, ssl=self._ssl
                    )
            except TimeoutError as exc:  # asyncio's
                raise RedisTimeout("Redis did not accept a connection in time") from exc
            except OSError as exc:
                raise ConnectionError(f"cannot connect to Redis: {exc}") from exc
            try:
                await self._hello(connection)
            except BaseException as exc:  # a wrong password: nothing may use this connection
                connection.close(ConnectionError(f"Redis refused the connection: {exc}"))
                raise
            self._connection = connection
            return connection

    async def _hello(self, connection: _Connection) -> None:
        """AUTH and SELECT from the URL, before anything else is sent on the connection."""
        hello: list[asyncio.Future[Reply]] = []
        if self._password is not None:
            auth = (self._username, self._password) if self._username else (self._password,)
            hello.append(connection.send(pack(("AUTH", *auth))))
        if self._db:
            hello.append(connection.send(pack(("SELECT", self._db))))
        for future in hello:
            await future

    async def execute(self, *args: bytes | str | int | float) -> Reply:
        payload = pack(args)
        for attempt in range(RECONNECT_RETRIES + 1):
            try:
                connection = await self._connect()
                return await connection.send(payload)
            except ConnectionError:
                if attempt == RECONNECT_RETRIES:
                    raise
                await asyncio.sleep(
                    min(RECONNECT_BACKOFF_S[0] * 2**attempt, RECONNECT_BACKOFF_S[1])
                )
        raise AssertionError("unreachable")

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: str | int | float) -> Reply:
        return await self.execute("EVALSHA", sha, numkeys, *keys_and_args)  # pack() writes numbers

    async def script_load(self, source: str) -> str:
        reply = await self.execute("SCRIPT", "LOAD", source)
        assert isinstance(reply, bytes)
        return reply.decode()

    async def set(self, key: str, value: str) -> Reply:
        return await self.execute("SET", key, value)

    async def get(self, key: str) -> bytes | None:
        reply = await self.execute("GET", key)
        assert reply is None or isinstance(reply, bytes)
        return reply

    async def ping(self) -> bool:
        return await self.execute("PING") == b"PONG"

    async def aclose(self) -> None:
        if self._connection is not None:
            self._connection.close(ConnectionError("the Redis client was closed"))
            self._connection = None

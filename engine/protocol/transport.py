"""HTTP details both sides of the wire need, framework-free: a request body read under a size
limit, and waiting for a client's disconnect on an ASGI `receive` channel.

Shared by the engine server and the gateway, so a limit is enforced, and a client that leaves is
noticed, the same way on both.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, MutableMapping
from typing import Any

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class BodyTooLarge(ValueError):
    """The body is (or declares to be) larger than the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is larger than {limit} bytes")
        self.limit = limit


async def read_capped(chunks: AsyncIterable[bytes], *, declared: str | None, limit: int) -> bytes:
    """The whole body; refused as soon as it is known to pass `limit` (a declared
    Content-Length over it is refused before anything is read)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        parts.append(chunk)
    return b"".join(parts)


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone. Only once the request body has been read in full:
    from then on, the next message on the channel can only be the disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass

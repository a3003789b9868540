"""One streamed response from an engine replica (gateway/engines/http.py's client opens it
after the first event): the events read line by line from the body, the body drained to its
end so the connection goes back to the pool, and an abort or an early close telling the
replica to drop the request."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from pydantic import ValidationError

from engine.protocol import GenerateResponse
from gateway.engines.api import EngineStreamError
from gateway.engines.http_wire import Response, WireError
from gateway.engines.replicas import Replica

if TYPE_CHECKING:
    from gateway.engines.http import HttpEngineClient

ReadEvent = Callable[[str], GenerateResponse]


class HttpStream:
    def __init__(
        self,
        client: HttpEngineClient,
        replica: Replica,
        request_id: str,
        response: Response,
        lines: AsyncIterator[str],
        first: GenerateResponse,
    ) -> None:
        self._client = client
        self._replica = replica
        # The engine's own name for the request, which its /abort_requests knows (vLLM renames
        # it; loragate's engine echoes ours).
        self._request_id = first.request_id or request_id
        self._response = response
        self._lines = lines
        self._first: GenerateResponse | None = first
        self._done = False
        self._closed = False
        self._aborted = False

    def __aiter__(self) -> AsyncIterator[GenerateResponse]:
        return self._events()

    async def _events(self) -> AsyncIterator[GenerateResponse]:
        if self._first is not None:
            first, self._first = self._first, None
            self._observe(first)
            yield first
        # One loop over the body's payloads (not next_event() an event): each event costs
        # one generator resumption on the request path.
        try:
            async for payload in self._lines:
                event = parse_event(payload, self._client.read_event)
                if event is None:
                    break
                self._observe(event)
                yield event
        except EngineStreamError:
            raise  # an error event: the request failed, the replica may be fine
        except WireError:
            self._client.mark_failed(self._replica)
            raise EngineStreamError("The engine replica failed mid-stream.") from None
        self._done = True
        await self._drain()

    def _observe(self, event: GenerateResponse) -> None:
        # The engine's word on its prefix cache, beside what routing expected (routing/router.py)
        if event.usage is not None:
            self._replica.routing.num_cached_tokens += event.usage.cached_tokens

    async def _drain(self) -> None:
        """Read to the end of the body, so the connection goes back to the pool."""
        with contextlib.suppress(WireError):
            async for _ in self._lines:
                pass

    def abort(self) -> None:
        if self._aborted or self._done or self._closed:
            return
        self._aborted = True
        self._client.abort_later(self._replica, self._request_id)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._replica.outstanding -= 1
        self._response.close()
        if not self._done and not self._aborted:
            self._client.abort_later(self._replica, self._request_id)


async def next_event(lines: AsyncIterator[str], read: ReadEvent) -> GenerateResponse | None:
    """The next event; None at `[DONE]` or the end of the body. `lines`: the body's `data:`
    payloads (http_wire.Response.data_lines)."""
    async for payload in lines:
        return parse_event(payload, read)
    return None


def parse_event(payload: str, read: ReadEvent) -> GenerateResponse | None:
    if payload == "[DONE]":
        return None
    try:
        if '"error"' in payload[:20]:
            error = json.loads(payload).get("error", {})
            raise EngineStreamError(str(error.get("message", "engine error"))[:500])
        return read(payload)
    except (ValueError, ValidationError) as exc:
        raise EngineStreamError("The engine sent an unreadable event.") from exc

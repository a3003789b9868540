"""One request's outputs as an async iterator on the caller's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.outputs import CompletionDelta, FinishReason, RequestOutput
from engine.request import EngineRequest, RequestId


class RequestStream:
    """The outputs of one request, in order. Closing it before the last one aborts the request.

    Used from the event loop that created it; the loop thread only calls `_push` through
    `call_soon_threadsafe`.
    """

    def __init__(self, request: EngineRequest, on_abandon: Callable[[RequestStream], None]) -> None:
        self.request = request
        # Called when the consumer stops listening before the request finished (aborts it).
        self._on_abandon = on_abandon
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._finished_choices: set[int] = set()
        self.finished = False
        self.closed = False

    @property
    def request_id(self) -> RequestId:
        return self.request.request_id

    def _push(self, output: RequestOutput) -> None:
        self._queue.put_nowait(output)

    def push_threadsafe(self, output: RequestOutput) -> bool:
        """From the loop thread; False when the consumer's event loop is gone."""
        try:
            self._loop.call_soon_threadsafe(self._push, output)
        except RuntimeError:
            return False
        return True

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished or self.closed:
            raise StopAsyncIteration
        output = await self._queue.get()
        # A synthetic final output (abort on shutdown, error on a dead loop) lists every choice;
        # drop the empty ones that had already finished.
        output.choices = [
            choice
            for choice in output.choices
            if choice.token_ids or choice.index not in self._finished_choices
        ]
        self._finished_choices.update(
            choice.index for choice in output.choices if choice.finish_reason is not None
        )
        if output.finished:
            self.finished = True
        return output

    def close(self) -> None:
        """Stop listening; an unfinished request is aborted (its KV blocks are freed).

        Synchronous so that it is safe in `finally` blocks of cancelled tasks.
        """
        if self.closed:
            return
        self.closed = True
        if not self.finished:
            self._on_abandon(self)


def final_output(
    request: EngineRequest, reason: FinishReason, error: str | None = None
) -> RequestOutput:
    """An output that ends a request which the engine can no longer finish itself."""
    return RequestOutput(
        request_id=request.request_id,
        choices=[
            CompletionDelta(index=index, token_ids=[], finish_reason=reason)
            for index in range(request.sampling_params.n)
        ],
        finished=True,
        num_prompt_tokens=len(request.prompt_token_ids),
        num_cached_tokens=0,
        error=error,
        priority=request.priority,
    )

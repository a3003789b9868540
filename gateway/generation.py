"""One OpenAI request's generation: its engine streams (one per prompt), its choices, its counts.

`deltas()` yields what the choices gained from each engine event. When every choice of a prompt
has ended on a stop string while the engine was still generating, that engine request is
aborted at once. Counts are the tokens actually consumed, whatever way the request ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from engine.protocol import GenerateRequest, PromptLogprob
from gateway.choices import ChoiceDelta, ChoiceState
from gateway.detokenizer import make_detokenizer
from gateway.engine_api import EngineClient, EngineStream, EngineStreamError
from gateway.policy import AdapterRef
from gateway.stop_strings import StopStringFilter
from gateway.tokenizer import Tokenizer

PromptLogprobs = list[dict[str, PromptLogprob] | None]

_END = object()


class Generation:
    def __init__(
        self,
        client: EngineClient,
        tokenizer: Tokenizer,
        requests: Sequence[GenerateRequest],
        *,
        adapter: AdapterRef | None,
        n: int,
        stops: Sequence[str],
        include_stop: bool,
        want_logprobs: bool,
    ) -> None:
        self._client = client
        self._requests = list(requests)
        self._adapter = adapter
        self._n = n
        self.choices = [
            ChoiceState(
                index,
                make_detokenizer(tokenizer),
                StopStringFilter(stops, include_stop=include_stop),
                want_logprobs=want_logprobs,
            )
            for index in range(len(self._requests) * n)
        ]
        self._streams: list[EngineStream] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.prompt_logprobs: list[PromptLogprobs | None] = [None] * len(self._requests)
        self.num_cached_tokens = 0
        self.engine_wait_s = 0.0
        self.first_token_at: float | None = None
        self.error: str | None = None

    # ---- accounting ----------------------------------------------------------------------------

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(request.token_ids) for request in self._requests)

    @property
    def num_completion_tokens(self) -> int:
        return sum(choice.num_tokens for choice in self.choices)

    @property
    def finish_reason(self) -> str:
        """One reason for the usage ledger: the most telling one over all choices."""
        reasons = {choice.finish_reason or "abort" for choice in self.choices}
        for reason in ("error", "abort", "length"):
            if reason in reasons:
                return reason
        return "stop"

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Submit every engine request; raises the first rejection (the others are aborted)."""
        try:
            for request in self._requests:
                self._streams.append(await self._client.open(request, self._adapter))
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        for stream in self._streams:
            await stream.aclose()

    def end_unfinished(self, reason: str) -> list[ChoiceDelta]:
        return [d for d in (choice.end(reason) for choice in self.choices) if d is not None]

    async def deltas(self) -> AsyncIterator[list[ChoiceDelta]]:
        """Raises EngineStreamError if an engine fails mid-stream (its choices end in `error`)."""
        try:
            if len(self._streams) == 1:
                async for deltas in self._consume(0, timed=True):
                    yield deltas
            else:
                async for deltas in self._merged():
                    yield deltas
        except EngineStreamError as exc:
            self.error = exc.message
            self.end_unfinished("error")
            raise
        ended = self.end_unfinished("abort")  # a stream that ended without finishing a choice
        if ended:
            yield ended

    async def _consume(self, prompt: int, *, timed: bool) -> AsyncIterator[list[ChoiceDelta]]:
        stream = self._streams[prompt]
        mine = self.choices[prompt * self._n : (prompt + 1) * self._n]
        events = stream.__aiter__()
        while True:
            started = time.perf_counter()
            try:
                event = await events.__anext__()
            except StopAsyncIteration:
                return
            finally:
                if timed:
                    self.engine_wait_s += time.perf_counter() - started
            if event.usage is not None:
                self.num_cached_tokens += event.usage.cached_tokens
            if event.prompt_logprobs is not None:
                self.prompt_logprobs[prompt] = event.prompt_logprobs
            out = [
                delta
                for delta in (mine[choice.index].feed(choice) for choice in event.choices)
                if delta is not None
            ]
            if out:
                if self.first_token_at is None and any(d.num_tokens for d in out):
                    self.first_token_at = time.perf_counter()
                yield out
            if all(choice.is_finished for choice in mine) and any(
                choice.is_cut_short for choice in mine
            ):
                await stream.aclose()  # stopped on a stop string: abort the engine request
                return

    async def _merged(self) -> AsyncIterator[list[ChoiceDelta]]:
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(prompt: int) -> None:
            try:
                async for deltas in self._consume(prompt, timed=False):
                    queue.put_nowait(deltas)
            except BaseException as exc:
                queue.put_nowait(exc)
                raise
            finally:
                queue.put_nowait(_END)

        self._tasks = [asyncio.create_task(pump(i)) for i in range(len(self._streams))]
        running = len(self._tasks)
        while running:
            started = time.perf_counter()
            item = await queue.get()
            self.engine_wait_s += time.perf_counter() - started
            if item is _END:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item

"""Run an admitted request on the engine and answer it, whole or streamed, for any renderer.

Streaming waits for the first engine event before sending headers, so every error that can
happen before the first token (quota, engine rejection, every replica down) is a proper HTTP
status; after that, an engine failure is an error event followed by `[DONE]`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Protocol

from fastapi import Request
from fastapi.responses import Response

from gateway.choices import ChoiceDelta
from gateway.coordinator import GenerationPlan
from gateway.engine_api import EngineStreamError
from gateway.errors import EngineFailed
from gateway.generation import Generation
from gateway.inference import InferenceRun
from gateway.render import JSON, error_event
from gateway.streaming import (
    SSE_DONE,
    EventStreamResponse,
    FinishingResponse,
    sse,
    unless_disconnected,
)


class Renderer(Protocol):
    def add(self, deltas: list[ChoiceDelta]) -> None: ...

    def body(self, generation: Generation) -> JSON: ...

    def stream_start(self, generation: Generation) -> list[bytes]: ...

    def stream_deltas(self, deltas: list[ChoiceDelta]) -> list[bytes]: ...

    def stream_end(self, generation: Generation) -> list[bytes]: ...


def _stream_error(message: str) -> bytes:
    return sse(error_event(message, code="engine_error")) + SSE_DONE


async def _whole(run: InferenceRun, plan: GenerationPlan, renderer: Renderer) -> Response:
    generation: Generation | None = None
    try:
        generation = await run.start(plan)
        try:
            async for deltas in generation.deltas():
                renderer.add(deltas)
        except EngineStreamError:
            raise EngineFailed("The engine failed while generating.") from None
        body = json.dumps(renderer.body(generation), separators=(",", ":")).encode()
    except BaseException:
        if generation is not None:
            await generation.aclose()
        await run.finish()
        raise
    await generation.aclose()
    # Settlement and the usage record run once the answer is on its way.
    return FinishingResponse(body, headers=run.headers(), on_sent=run.finish)


async def _events(
    run: InferenceRun, plan: GenerationPlan, renderer: Renderer
) -> AsyncGenerator[bytes, None]:
    generation: Generation | None = None
    try:
        generation = await run.start(plan)
        started = False
        try:
            async for deltas in generation.deltas():
                chunks = renderer.stream_deltas(deltas)
                if not started:
                    chunks = renderer.stream_start(generation) + chunks
                    started = True
                yield b"".join(chunks)
        except EngineStreamError:
            if not started:  # nothing sent yet: an HTTP error status is still possible
                raise EngineFailed("The engine failed while generating.") from None
            yield _stream_error("The engine failed while generating.")
            return
        if not started:
            yield b"".join(renderer.stream_start(generation))
        yield b"".join(renderer.stream_end(generation))
    finally:
        if generation is not None:
            await generation.aclose()
        await run.finish()


async def respond(
    request: Request,
    run: InferenceRun,
    plan: GenerationPlan,
    renderer: Renderer,
    *,
    stream: bool,
) -> Response:
    if not stream:
        return await unless_disconnected(request, _whole(run, plan, renderer))
    events = _events(run, plan, renderer)
    first = await unless_disconnected(request, events.__anext__())
    return EventStreamResponse(
        [first],
        events,
        headers=run.headers(),
        keepalive_s=run.state.settings.sse_keepalive_s,
    )

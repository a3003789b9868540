"""Answer a pass-through generate request: the engine's events, whole or streamed, with the
tenant's bookkeeping (admission, settlement, usage, metrics) around them."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from fastapi import Request
from fastapi.responses import Response

from engine.protocol import SSE_DONE, GenerateRequest, error_body, sse_event
from gateway.coordinator import Coordinator
from gateway.engine_api import EngineStream, EngineStreamError
from gateway.engine_client import check_sampling
from gateway.errors import BadRequest, ContextLengthExceeded, EngineFailed
from gateway.inference import InferenceRun
from gateway.passthrough import Collector, Relay, policy_request
from gateway.streaming import EventStreamResponse, FinishingResponse, unless_disconnected


def engine_request(
    coordinator: Coordinator, run: InferenceRun, wire: GenerateRequest
) -> GenerateRequest:
    """Validate what the engine would refuse, then apply the tenant's policy."""
    if wire.features is not None:
        raise BadRequest("features is not supported: this engine is text-only.", param="features")
    coordinator.check_token_ids(wire.token_ids, param="token_ids")
    room = coordinator.max_model_len - len(wire.token_ids)
    if room < 1:
        raise ContextLengthExceeded(
            f"The prompt has {len(wire.token_ids)} tokens; this model's context length is "
            f"{coordinator.max_model_len}.",
            param="token_ids",
        )
    check_sampling(wire.sampling_params, vocab_size=coordinator.vocab_size)
    return policy_request(
        wire,
        request_id=run.request_id,
        salt=run.ctx.salt,
        tenant_id=run.ctx.tenant_id,
        priority=run.priority,
        engine_model=run.model.engine_model,
        max_tokens=min(wire.sampling_params.max_tokens, room),
    )


async def _open(
    run: InferenceRun, request: GenerateRequest, client_id: str
) -> tuple[EngineStream, Relay]:
    params = request.sampling_params
    await run.admit(len(request.token_ids) + params.n * params.max_tokens)
    stream = await run.state.engine.open(request, run.model.adapter)
    relay = Relay(request, client_id)
    run.accounting = relay
    return stream, relay


async def _whole(run: InferenceRun, request: GenerateRequest, wire: GenerateRequest) -> Response:
    stream: EngineStream | None = None
    try:
        stream, relay = await _open(run, request, wire.request_id)
        collector = Collector(
            wire.request_id, request.sampling_params.n, request.sampling_params.logprobs is not None
        )
        try:
            async for event in relay.events(stream):
                collector.add(event)
        except EngineStreamError:
            relay.failed = True
            raise EngineFailed("The engine failed while generating.") from None
        body = collector.response().model_dump_json().encode()
    except BaseException:
        if stream is not None:
            await stream.aclose()
        await run.finish()
        raise
    await stream.aclose()
    # Settlement and the usage record run once the answer is on its way.
    return FinishingResponse(body, headers=run.headers(), on_sent=run.finish)


async def _events(
    run: InferenceRun, request: GenerateRequest, wire: GenerateRequest
) -> AsyncGenerator[bytes, None]:
    stream: EngineStream | None = None
    try:
        stream, relay = await _open(run, request, wire.request_id)
        started = False
        try:
            async for event in relay.events(stream):
                if event.usage is not None and not wire.include_usage:
                    continue
                started = True
                yield sse_event(event)
        except EngineStreamError:
            relay.failed = True
            if not started:
                raise EngineFailed("The engine failed while generating.") from None
            message = "The engine failed while generating."
            yield sse_event(error_body(message, error_type="server_error", code=500)) + SSE_DONE
            return
        yield SSE_DONE
    finally:
        if stream is not None:
            await stream.aclose()
        await run.finish()


async def respond_passthrough(
    request: Request, run: InferenceRun, engine_request: GenerateRequest, wire: GenerateRequest
) -> Response:
    if not wire.stream:
        return await unless_disconnected(request, _whole(run, engine_request, wire))
    events = _events(run, engine_request, wire)
    first = await unless_disconnected(request, events.__anext__())
    return EventStreamResponse(
        [first], events, headers=run.headers(), keepalive_s=run.state.settings.sse_keepalive_s
    )

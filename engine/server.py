"""The engine's HTTP server: vLLM's tokens-only protocol (docs/tokens-api.md), health, metrics.

The only engine module that imports FastAPI. Routes stay thin: parse with engine.protocol, call
the AsyncEngine, shape the response; every EngineError becomes its HTTP status in one handler.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine import adapter_admin
from engine.config import EngineConfig
from engine.errors import AdminAuthError, EngineError, RequestTooLargeError
from engine.loop.async_engine import AsyncEngine, RequestStream
from engine.metrics import AdapterFetchCollector, EngineMetrics, finish_reason
from engine.outputs import RequestOutput
from engine.protocol import (
    SSE_DONE,
    BodyTooLarge,
    EngineLimits,
    GenerateRequest,
    GenerateResponse,
    ResponseBuilder,
    error_body,
    is_error_output,
    parse_abort_request,
    parse_generate_request,
    read_capped,
    sse_event,
    to_engine_request,
    wait_for_disconnect,
)
from engine.protocol.tracing import EngineTrace, tracer_for
from lora.errors import AdapterError
from lora.remote.fetched import FetchedAdapters

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 << 20
DEFAULT_DRAIN_TIMEOUT_S = 30.0
# Not a standard status: what nginx logs for a client that closed the connection first.
CLIENT_CLOSED_REQUEST = 499


# ---- dependencies ----------------------------------------------------------------------------


def require_admin(request: Request) -> None:
    """When an admin token is configured, `Authorization: Bearer <token>` must carry it."""
    token: str | None = request.app.state.admin_token
    if not token:
        return
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    # Digests make the comparison constant-time whatever the presented length.
    expected = hmac.new(b"loragate-admin", token.encode(), "sha256").digest()
    given = hmac.new(b"loragate-admin", presented.strip().encode(), "sha256").digest()
    if scheme.lower() != "bearer" or not hmac.compare_digest(expected, given):
        raise AdminAuthError("the adapter endpoints need the engine's admin token")


def get_engine(request: Request) -> AsyncEngine:
    engine: AsyncEngine = request.app.state.engine
    return engine


def get_metrics(request: Request) -> EngineMetrics:
    metrics: EngineMetrics = request.app.state.metrics
    return metrics


async def read_body(request: Request) -> bytes:
    try:
        return await read_capped(
            request.stream(),
            declared=request.headers.get("content-length"),
            limit=request.app.state.max_body_bytes,
        )
    except BodyTooLarge as exc:
        raise RequestTooLargeError(str(exc)) from None


EngineDep = Annotated[AsyncEngine, Depends(get_engine)]
MetricsDep = Annotated[EngineMetrics, Depends(get_metrics)]
BodyDep = Annotated[bytes, Depends(read_body)]
AdminDep = Depends(require_admin)


def engine_limits(engine: AsyncEngine) -> EngineLimits:
    return EngineLimits(
        vocab_size=engine.vocab_size,
        max_model_len=engine.max_model_len,
        base_model_name=engine.model_name,
    )


# ---- responses -------------------------------------------------------------------------------


def _json(payload: BaseModel, status_code: int = 200) -> Response:
    return Response(payload.model_dump_json(), status_code, media_type="application/json")


def error_response(exc: EngineError) -> Response:
    body = error_body(
        exc.message,
        error_type=exc.error_type,
        param=exc.param,
        code=exc.code if exc.code is not None else exc.status_code,
    )
    return _json(body, exc.status_code)


async def _engine_error_handler(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, EngineError):  # registered for EngineError only
        raise exc
    return error_response(exc)


async def _adapter_error_handler(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, AdapterError):  # registered for AdapterError only
        raise exc
    body = error_body(
        exc.message, error_type="invalid_request_error", param=exc.param, code=exc.status_code
    )
    return _json(body, exc.status_code)


async def _unexpected_error_handler(request: Request, exc: Exception) -> Response:
    logger.error("unhandled %s on %s", type(exc).__name__, request.url.path, exc_info=exc)
    return error_response(EngineError("internal server error"))


class _EventStreamResponse(StreamingResponse):
    """SSE response that runs `on_close` however the stream ends (done, error, disconnect)."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class _RequestRun:
    """One admitted request: its stream, the wire builder and the metric bookkeeping."""

    def __init__(
        self,
        wire: GenerateRequest,
        stream: RequestStream,
        metrics: EngineMetrics,
        trace: EngineTrace | None,
    ) -> None:
        self.wire = wire
        self.stream = stream
        self.builder = ResponseBuilder(wire)
        self._metrics = metrics
        self._trace = trace  # None: tracing is off

    def finish(self, output: RequestOutput) -> None:
        self._metrics.requests.observe_output(output, num_choices=self.wire.sampling_params.n)
        if self._trace is not None:
            self._trace.observe(output, finish_reason)

    def close(self) -> None:
        if not self.stream.finished and not self.stream.closed:
            self._metrics.requests.observe_abandoned()
        if self._trace is not None:  # ended already unless the client left first
            self._trace.end("abort")
        self.stream.close()

    async def events(self) -> AsyncIterator[bytes]:
        builder = self.builder
        failed = False
        try:
            async for output in self.stream:
                self.finish(output)
                if is_error_output(output):
                    chunk = builder.chunk(output)  # tokens produced before the failure
                    if chunk is not None and chunk.choices:
                        yield sse_event(chunk)
                    failed = True
                    if self.wire.include_usage:
                        yield sse_event(builder.usage_chunk())
                    message = output.error or "the engine failed while generating"
                    yield sse_event(error_body(message, error_type="server_error", code=500))
                    break
                chunk = builder.chunk(output)
                if chunk is not None:
                    yield sse_event(chunk)
        except Exception as exc:  # headers are sent: the only way left to report it
            logger.error("stream failed with %s", type(exc).__name__, exc_info=exc)
            failed = True
            yield sse_event(
                error_body("internal server error", error_type="server_error", code=500)
            )
        if not failed and self.wire.include_usage:
            yield sse_event(builder.usage_chunk())
        yield SSE_DONE

    async def collect(self) -> GenerateResponse:
        try:
            async for output in self.stream:
                self.finish(output)
                if is_error_output(output):
                    raise EngineError(output.error or "the engine failed while generating")
                self.builder.add(output)
        finally:
            self.close()
        return self.builder.response()


async def _unless_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """Run `work`, cancelling it (so its request is aborted) if the client goes away first."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
        if not work_task.done():
            work_task.cancel()
            await asyncio.gather(work_task, return_exceptions=True)
    if work_task.cancelled():
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return work_task.result()


# ---- routes ----------------------------------------------------------------------------------

router = APIRouter()


@router.post("/inference/v1/generate", response_model=None)
async def generate(
    request: Request, engine: EngineDep, metrics: MetricsDep, body: BodyDep
) -> Response:
    wire = parse_generate_request(body)
    engine_request = to_engine_request(wire, engine_limits(engine))
    tracer = request.app.state.tracer
    trace = None if tracer is None else EngineTrace(tracer, engine_request, request.headers)
    stream = await engine.add_request(engine_request)
    run = _RequestRun(wire, stream, metrics, trace)
    if wire.stream:
        return _EventStreamResponse(run.events(), on_close=run.close)

    async def respond() -> Response:
        return _json(await run.collect())

    return await _unless_disconnected(request, respond())


@router.post("/abort_requests", response_model=None)
async def abort_requests(engine: EngineDep, body: BodyDep) -> Response:
    await engine.abort(parse_abort_request(body))
    return Response(status_code=200)


@router.get("/health", response_model=None)
async def health(engine: EngineDep) -> Response:
    if engine.is_healthy:
        return JSONResponse({"status": "ok"})
    status = "dead" if engine.is_dead else "draining"
    return JSONResponse({"status": status}, status_code=503)


@router.get("/metrics", response_model=None)
async def metrics_endpoint(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


# ---- adapters --------------------------------------------------------------------------------


@router.post("/v1/load_lora_adapter", response_model=None, dependencies=[AdminDep])
async def load_lora_adapter(request: Request, engine: EngineDep, body: BodyDep) -> Response:
    load = adapter_admin.parse_load(body, base_model_name=engine.model_name)
    record = await adapter_admin.load_requested(engine, load, request.app.state.adapters)
    return JSONResponse({"lora_name": record.name, "rank": record.rank, "status": "loaded"})


@router.post("/v1/unload_lora_adapter", response_model=None, dependencies=[AdminDep])
async def unload_lora_adapter(engine: EngineDep, body: BodyDep) -> Response:
    name = adapter_admin.parse_unload(body)
    await adapter_admin.unload(engine, name)
    return JSONResponse({"lora_name": name, "status": "unloaded"})


@router.get("/v1/models", response_model=None, dependencies=[AdminDep])
async def list_models(request: Request, engine: EngineDep) -> Response:
    data = await adapter_admin.list_models(engine, created=request.app.state.created)
    return JSONResponse({"object": "list", "data": data})


# ---- app -------------------------------------------------------------------------------------


def create_app(
    engine: AsyncEngine,
    *,
    admin_token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    tracer: Tracer | None = None,
    adapters: FetchedAdapters | None = None,
) -> FastAPI:
    """The engine's ASGI app; its lifespan drains the engine on shutdown. `tracer`: None, tracing
    is off (engine/protocol/tracing.py). `adapters`: fetches adapters named by hash (or None)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if adapters is not None:
            await adapter_admin.attach_store(engine, adapters)
        yield
        await engine.shutdown(drain_timeout_s)

    app = FastAPI(
        title="loragate engine",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.engine = engine
    app.state.metrics = EngineMetrics(
        model_name=engine.model_name, stats=engine.stats, choices=engine.startup_choices
    )
    app.state.admin_token = admin_token  # for the adapter endpoints
    app.state.adapters = adapters
    if adapters is not None:
        app.state.metrics.registry.register(AdapterFetchCollector(adapters, engine.model_name))
    app.state.max_body_bytes = max_body_bytes
    app.state.tracer = tracer
    app.state.created = int(time.time())
    app.add_exception_handler(EngineError, _engine_error_handler)
    app.add_exception_handler(AdapterError, _adapter_error_handler)
    app.add_exception_handler(Exception, _unexpected_error_handler)
    app.include_router(router)
    return app


def serve(
    config: EngineConfig,
    *,
    host: str,
    port: int,
    admin_token: str | None,
    otel_endpoint: str | None,
    adapter_source: str | None = None,
) -> None:
    """Load the model, then serve until SIGINT/SIGTERM, draining on the way out. The engine loop
    runs on this (the main) thread, HTTP on another (engine/loop/on_main.py). `otel_endpoint`:
    where spans go (None: no tracing)."""
    import uvicorn

    from engine.loop.on_main import serve_beside_loop

    engine = AsyncEngine.from_config(config, start_thread=False)
    tracer = tracer_for(otel_endpoint, service_name="loragate-engine")
    adapters = adapter_admin.adapter_source(adapter_source, admin_token, config)
    app = create_app(engine, admin_token=admin_token, tracer=tracer, adapters=adapters)
    # As the gateway does (gateway/app.py tune_gc_for_serving says why): start-up's objects
    # out of full collections (each a stalled step), young collections at 10,000 objects.
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            timeout_graceful_shutdown=int(DEFAULT_DRAIN_TIMEOUT_S),
            log_level="info",
        )
    )
    serve_beside_loop(engine, server, server.handle_exit)

"""The in-process engine client (the embedded default): the AsyncEngine in this process.

The only gateway module that imports the engine beyond its wire schema (an import-linter
contract lists each of its imports). Outputs are rendered into the same wire events the HTTP
client parses, so everything above this module runs one code path for both kinds of engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from prometheus_client import CollectorRegistry

from engine import adapter_admin
from engine.errors import (
    AdapterNotFoundError,
    EngineError,
    EngineUnavailableError,
    InvalidRequestError,
)
from engine.loop.async_engine import AsyncEngine
from engine.loop.on_main import Server, SignalHandler, serve_beside_loop
from engine.loop.request_stream import RequestStream
from engine.metrics import EngineStatsCollector, RequestMetrics, finish_reason
from engine.outputs import EngineStats
from engine.protocol import (
    TRACEPARENT,
    EngineLimits,
    EngineTrace,
    GenerateRequest,
    GenerateResponse,
    ResponseBuilder,
    StructuredSpec,
    is_error_output,
    to_engine_request,
)
from gateway.engines.api import EngineStreamError
from gateway.errors import EngineFailed, EngineOverloaded, ModelNotFound
from gateway.policy import AdapterRef
from gateway.settings import GatewaySettings
from tenancy.errors import BadRequest, ClientError

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

INPROCESS = "inprocess"


class Bundle(Protocol):
    """What the store hands out (tenancy/adapters/store.py BundleStream)."""

    sha256: str
    chunks: AsyncIterator[bytes]


OpenBundle = Callable[[str], Coroutine[Any, Any, Bundle | None]]


async def _next(chunks: AsyncIterator[bytes]) -> bytes:
    return await anext(chunks)


class StoreFetcher:
    """The embedded engine's adapter source: the store itself, no HTTP. Its `fetch` runs on the
    engine's threads (the load's worker, the LoRA reader) and reads on the gateway's event loop,
    one chunk at a time; the engine checks the hash and unpacks as an engine server does."""

    def __init__(self, open_bundle: OpenBundle, loop: asyncio.AbstractEventLoop) -> None:
        self._open = open_bundle
        self._loop = loop

    def fetch(self, adapter_id: str, out: BinaryIO, *, max_bytes: int) -> str | None:
        opened = asyncio.run_coroutine_threadsafe(self._open(adapter_id), self._loop)
        bundle: Bundle | None = opened.result()
        if bundle is None:
            raise LookupError(adapter_id)  # deleted since this gateway listed it
        received = 0
        chunks = bundle.chunks
        while True:
            try:
                chunk = asyncio.run_coroutine_threadsafe(_next(chunks), self._loop).result()
            except StopAsyncIteration:
                return bundle.sha256
            received += len(chunk)
            if received > max_bytes:
                raise ValueError("the adapter bundle exceeds the engine's limit")
            out.write(chunk)


log = logging.getLogger(__name__)


def gateway_error(exc: EngineError) -> ClientError:
    """An engine error raised before anything streamed, as the gateway answers it."""
    if isinstance(exc, InvalidRequestError):
        return BadRequest(exc.message, param=exc.param)
    if isinstance(exc, AdapterNotFoundError):
        return ModelNotFound()
    if isinstance(exc, EngineUnavailableError):
        return EngineOverloaded(exc.message)
    return EngineFailed()


class LocalStream:
    """One request's outputs as wire events; closing it early aborts the request."""

    def __init__(
        self,
        engine: AsyncEngine,
        wire: GenerateRequest,
        stream: RequestStream,
        metrics: RequestMetrics | None = None,
        trace: EngineTrace | None = None,
    ) -> None:
        self._engine = engine
        self._wire = wire
        self._builder = ResponseBuilder(wire)
        self._stream = stream
        self._metrics = metrics
        self._trace = trace  # the engine's spans, as an engine server records them
        self._aborted = False

    def __aiter__(self) -> AsyncIterator[GenerateResponse]:
        return self._events()

    async def _events(self) -> AsyncIterator[GenerateResponse]:
        builder = self._builder
        async for output in self._stream:
            if self._metrics is not None:
                self._metrics.observe_output(output, num_choices=self._wire.sampling_params.n)
            if self._trace is not None:
                self._trace.observe(output, finish_reason)
            chunk = builder.chunk(output)
            if is_error_output(output):
                if chunk is not None and any(choice.token_ids for choice in chunk.choices):
                    yield chunk  # the tokens produced before the failure
                raise EngineStreamError(output.error or "the engine failed while generating")
            if chunk is not None:
                yield chunk
        if self._stream.finished:
            yield builder.usage_chunk()

    def abort(self) -> None:
        if self._aborted or self._stream.finished or self._stream.closed:
            return
        self._aborted = True
        self._engine.abort_nowait(self._stream.request_id)

    async def aclose(self) -> None:
        if self._metrics is not None and not self._stream.finished and not self._stream.closed:
            self._metrics.observe_abandoned()  # as the engine server counts a client gone
        if self._trace is not None:  # ended already unless the request was cut short
            self._trace.end("abort")
        self._stream.close()


class InProcessEngineClient:
    def __init__(self, engine: AsyncEngine, *, drain_timeout_s: float = 30.0) -> None:
        self.engine = engine
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.vocab_size
        self._drain_timeout_s = drain_timeout_s
        self._loaded: dict[str, asyncio.Future[Any]] = {}
        self._metrics: RequestMetrics | None = None  # once registered on the gateway's /metrics
        self._tracer: Tracer | None = None  # once the gateway traces (use_tracer)
        self._unloads: set[asyncio.Task[bool]] = set()
        self._adapters: adapter_admin.FetchedAdapters | None = None  # use_adapter_store
        self._limits = EngineLimits(
            vocab_size=engine.vocab_size,
            max_model_len=engine.max_model_len,
            base_model_name=engine.model_name,
        )

    @classmethod
    async def from_settings(cls, settings: GatewaySettings) -> InProcessEngineClient:
        # Loading weights takes seconds: off the event loop.
        config = settings.engine.to_engine_config(
            model=str(settings.model), served_model_name=settings.model_name
        )
        engine = await asyncio.to_thread(AsyncEngine.from_config, config)
        return cls(engine, drain_timeout_s=settings.engine_drain_timeout_s)

    async def start(self) -> None:
        return None

    async def use_adapter_store(
        self, open_bundle: OpenBundle, *, cache_dir: str | None, max_bytes: int
    ) -> None:
        """Load adapters named by hash from the gateway's store (fetched, checked and unpacked
        into a disk cache, as an engine server does), not from a path."""
        fetcher = StoreFetcher(open_bundle, asyncio.get_running_loop())
        self._adapters = adapter_admin.fetched_adapters(cache_dir, max_bytes, fetcher)
        await adapter_admin.attach_store(self.engine, self._adapters)

    async def check_constraint(self, spec: StructuredSpec) -> None:
        await self.engine.compile_grammar(spec)

    async def open(
        self, request: GenerateRequest, adapter: AdapterRef | None, traceparent: str | None = None
    ) -> LocalStream:
        if adapter is not None:
            await self._ensure_loaded(adapter)
        try:
            stream = await self._add(request)
        except AdapterNotFoundError:
            if adapter is None:
                raise ModelNotFound() from None
            self._loaded.pop(adapter.engine_name, None)  # unloaded meanwhile: load it again
            await self._ensure_loaded(adapter)
            stream = await self._add(request)
        trace = None
        if self._tracer is not None:
            headers = {TRACEPARENT: traceparent} if traceparent is not None else {}
            trace = EngineTrace(self._tracer, to_engine_request(request, self._limits), headers)
        return LocalStream(self.engine, request, stream, self._metrics, trace)

    async def _add(self, request: GenerateRequest) -> RequestStream:
        try:
            return await self.engine.add_request(to_engine_request(request, self._limits))
        except AdapterNotFoundError:
            raise
        except EngineError as exc:
            raise gateway_error(exc) from None

    async def _ensure_loaded(self, adapter: AdapterRef) -> None:
        """Register the adapter with the engine once (concurrent first requests share one load).
        The engine moves it between its disk, CPU and device tiers by itself afterwards."""
        pending: asyncio.Future[Any] | None = self._loaded.get(adapter.engine_name)
        if pending is None:
            pending = asyncio.ensure_future(self._load(adapter))
            self._loaded[adapter.engine_name] = pending
        try:
            await asyncio.shield(pending)
        except Exception as exc:  # lora's AdapterError (outside our import rules) or I/O
            self._loaded.pop(adapter.engine_name, None)
            gone = isinstance(exc, LookupError) or getattr(exc, "status_code", None) == 404
            if gone or (self._adapters is None and not Path(adapter.path).exists()):
                raise ModelNotFound() from None  # deleted since this gateway last listed it
            log.error("loading an adapter failed with %s", type(exc).__name__)
            if getattr(exc, "status_code", None) == 502:  # refused: a wrong hash, cut short
                raise EngineFailed(
                    f"The adapter could not be loaded: {exc}", status_code=502
                ) from None
            raise EngineFailed("The adapter could not be loaded.") from None

    async def _load(self, adapter: AdapterRef) -> Any:
        if self._adapters is not None and adapter.sha256:
            request = adapter_admin.LoadRequest(adapter.engine_name, None, adapter.sha256)
            return await adapter_admin.load_requested(self.engine, request, self._adapters)
        return await adapter_admin.load(self.engine, adapter.engine_name, adapter.path)

    def start_unload(self, engine_name: str) -> None:
        self._loaded.pop(engine_name, None)  # a later upload of the same id loads afresh
        task = asyncio.create_task(adapter_admin.unload_if_present(self.engine, engine_name))
        self._unloads.add(task)
        task.add_done_callback(self._unload_done)

    def _unload_done(self, task: asyncio.Task[bool]) -> None:
        self._unloads.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("unloading an adapter failed with %s", type(task.exception()).__name__)

    async def check_ready(self) -> dict[str, bool]:
        return {INPROCESS: self.engine.is_healthy}

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """The engine's own metrics (vLLM names) on the gateway's /metrics: its gauges and
        counters read at scrape time, and the request histograms, observed here as each
        request's outputs are read (what the engine server does for an engine of its own)."""
        registry.register(EngineStatsCollector(self.engine.stats, self.model_name))
        self._metrics = RequestMetrics(registry, self.model_name)

    def use_tracer(self, tracer: Tracer | None) -> None:
        """Record the engine's spans (engine/protocol/tracing.py) with the gateway's tracer,
        under the gateway's engine-call span, as an engine server would."""
        self._tracer = tracer

    async def close(self) -> None:
        for task in self._unloads:
            task.cancel()
        await self.engine.shutdown(self._drain_timeout_s)


class MainThreadEngine:
    """The embedded engine of `loragate serve`: the engine loop runs on the thread that calls
    `serve` (the main thread), the HTTP server on a thread of its own (engine/loop/on_main.py).
    Stepped from any other thread, bf16 matmuls ran 1.6x slower (a batch-1 decode step 11.6 ms
    against 7.0; bench/RESULTS.md, "A decode step on a worker thread, this VM")."""

    def __init__(self, settings: GatewaySettings) -> None:
        config = settings.engine.to_engine_config(
            model=str(settings.model), served_model_name=settings.model_name
        )
        self._engine = AsyncEngine.from_config(config, start_thread=False)
        self.client = InProcessEngineClient(
            self._engine, drain_timeout_s=settings.engine_drain_timeout_s
        )

    def serve(self, server: Server, on_signal: SignalHandler) -> None:
        """Run `server` on a thread and the engine loop here until both end, then end as
        `uvicorn.run` would (engine/loop/on_main.py, serve_beside_loop)."""
        serve_beside_loop(self._engine, server, on_signal)

"""The gateway app factory: `create_app(settings)`; the lifespan builds everything once.

Start-up: database engine (and schema, with `auto_migrate`), quota store, key verifier (the
tenancy runtime), tokenizer, engine client(s), usage writer, metrics, budget alerts, the
request lifecycle.
Shutdown, in order: the lifecycle drains (requests in flight finish or are stopped at the grace
period, and settle), the engines close, the usage ledger is flushed, the stores close.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from gateway.admin import admin_router
from gateway.api_docs.openapi import OPENAPI_URL, install_openapi
from gateway.api_docs.page import docs_router
from gateway.dashboard import install_dashboard
from gateway.dashboard.state import Dashboard
from gateway.engines.api import EngineClient
from gateway.engines.build import build_engine_client
from gateway.engines.pools import ModelPool, build_other_pools, start_engine
from gateway.error_handlers import install_error_handlers
from gateway.lifecycle.bookkeeping import Bookkeeping, UsageWriter
from gateway.lifecycle.job import Planner
from gateway.lifecycle.service import RequestLifecycle
from gateway.middleware import EdgeMiddleware
from gateway.policy import PolicyService
from gateway.routes import chat, completions, generate, health, internal, models, responses
from gateway.routes.direct import DirectRoutes, post_endpoints
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.telemetry.engines import EngineRegistries
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing import Tracing
from gateway.text.tokenizer import Tokenizer
from tenancy.alerts.service import AlertService
from tenancy.runtime import build_runtime
from tenancy.sql.migrate import check_schema, upgrade

# FastAPI 0.16x instruments every request itself once a global OpenTelemetry provider exists, and
# asks on each request whether one does (about 4 us). The gateway traces through a provider of its
# own (gateway/telemetry/tracing.py): the framework's spans and metrics would double them.
NO_FRAMEWORK_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}  # older FastAPI: no such instrumentation
)


# Young-generation threshold for a serving process. CPython's 700 counts tracked objects alive
# at once, and one request's transient objects (parsed JSON, models, frames) pass 700 before they
# are freed: a young collection every ~16 chat requests, each walking live objects only, ~23 us
# a request of pure overhead (measured with gc.callbacks under wrk). At 10,000 almost every such
# object is freed by reference counting first: one young collection in thousands of requests.
YOUNG_GC_THRESHOLD = 10_000


def tune_gc_for_serving() -> None:
    """Set the collector up for a long-running server, once start-up is done.

    Start-up leaves about 450,000 tracked objects (transformers, torch, the app), almost all
    alive for the process's life. CPython's full collection visits every one of them: 230-380
    ms here, during which the event loop answers nothing, and one came every few thousand
    requests. Frozen (gc.freeze), they are never visited again: a full pass covers what was made
    since. Start-up's garbage is collected first, so nothing collectable is frozen."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)


def _ensure_sqlite_dir(url: str) -> None:
    if url.startswith("sqlite") and ":///" in url:
        path = url.split(":///", 1)[1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)


async def build_state(
    settings: GatewaySettings, engine_client: EngineClient | None = None
) -> GatewayState:
    """`engine_client`: one built already (`loragate serve`'s embedded engine, whose loop runs on
    the main thread); None builds the one the settings ask for."""
    _ensure_sqlite_dir(settings.database_url)
    runtime = await build_runtime(settings)
    try:
        if settings.auto_migrate:
            await upgrade(runtime.engine)
        await check_schema(runtime.engine)  # a clear refusal, not a 503 on every request
        # Versions stored before the content-addressed store get their blob and bundle hash.
        await runtime.adapters.store.adopt_legacy(runtime.sessionmaker)
        tokenizer = await asyncio.to_thread(Tokenizer.load, settings.model, settings.chat_template)
        engine = engine_client or await build_engine_client(
            settings, runtime.priority.vllm_priority
        )
    except BaseException:
        await runtime.close()
        raise
    await start_engine(settings, runtime, engine)
    # More base models (LORAGATE_MODELS): a pool each, started here (none by default).
    built: list[ModelPool] = []
    try:
        built = await build_other_pools(settings, runtime, runtime.priority.vllm_priority)
        # Before the first admission, so a restart hands no budget back; after every model is
        # served, so each model's spending counts against its own policies again.
        await runtime.restore_budgets()
    except BaseException:
        for pool in built:
            with contextlib.suppress(Exception):
                await pool.engine.close()
        await engine.close()
        await runtime.close()
        raise
    others = {pool.name: pool for pool in built}
    engines = [engine, *(pool.engine for pool in built)]  # every model's, the primary's first
    metrics = GatewayMetrics(
        max_tenants=settings.max_metric_tenants, max_models=settings.max_metric_models
    )
    # Every in-process engine's own metrics, a registry each, merged at scrape time.
    engine_registries = []
    for each in engines:
        register = getattr(each, "register_metrics", None)
        if register is not None:
            engine_registries.append(CollectorRegistry())
            register(engine_registries[-1])
    if engine_registries:
        metrics.registry.register(EngineRegistries(engine_registries))
    usage = UsageWriter(
        runtime.sessionmaker,
        flush_interval_s=settings.usage_flush_interval_s,
        batch_size=settings.usage_batch_size,
        max_pending=settings.usage_max_pending,
    )
    usage.start()
    metrics.usage_ledger.watch(usage)
    policy = PolicyService(
        runtime, base_model=settings.model_name, cache_ttl_s=settings.policy_cache_ttl_s,
        other_models=tuple(others),
    )  # fmt: skip
    alerts = AlertService(
        settings, runtime.sessionmaker, runtime.quotas, cache_ttl_s=settings.policy_cache_ttl_s
    )
    alerts.start()
    tracing = Tracing.from_settings(settings)  # None unless LORAGATE_OTEL_ENDPOINT is set
    if tracing is not None:
        for traced in engines:
            tracing.instrument(traced)
    lifecycle = RequestLifecycle(
        settings=settings,
        policy=policy,
        planner=Planner(
            tokenizer, settings, vocab_size=engine.vocab_size, max_model_len=engine.max_model_len
        ),
        engine=engine,
        quotas=runtime.quotas,
        tracing=tracing,
        books=Bookkeeping(runtime.quotas, usage, metrics, alerts),
        others=others,
    )
    return GatewayState(
        settings=settings,
        tenancy=runtime,
        policy=policy,
        tokenizer=tokenizer,
        engine=engine,
        lifecycle=lifecycle,
        usage=usage,
        metrics=metrics,
        tracing=tracing,
        alerts=alerts,
        others=others,
    )


async def close_state(state: GatewayState) -> None:
    """Each step runs even if an earlier one failed (last pushed, first run)."""
    async with contextlib.AsyncExitStack() as steps:
        steps.push_async_callback(state.tenancy.close)
        if state.tracing is not None:  # the last spans, once every run has ended
            steps.push_async_callback(state.tracing.close)
        steps.push_async_callback(state.usage.close)  # after every run has recorded
        if state.alerts is not None:  # after every run has settled
            steps.push_async_callback(state.alerts.close)
        for engine in state.engines().values():
            steps.push_async_callback(engine.close)
        await state.lifecycle.drain(state.settings.shutdown_grace_s)


@contextlib.contextmanager
def drain_on_signals(state: GatewayState) -> Iterator[None]:
    """SIGTERM/SIGINT start the lifecycle's drain, and once it has ended go on to the server's
    own handler (`_drain_then`).

    uvicorn, on SIGTERM, stops accepting, waits for the connections still busy and cancels
    them at its own timeout; the app hears of the shutdown only after that. Chaining the
    handler lets every stream in flight get the grace period and then an error event and
    `[DONE]` (never a cut connection), with its settlement and usage record written, and keeps
    the socket listening meanwhile (new requests: 503 `shutting_down`). Installed from the
    lifespan, so it runs in every worker process, after uvicorn's own handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(sig: int, frame: FrameType | None) -> None:
        then = previous[signal.Signals(sig)]
        after = (lambda: then(sig, frame)) if callable(then) else (lambda: None)
        loop.call_soon_threadsafe(_drain_then, state, after)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, then in previous.items():
            signal.signal(sig, then)


def _drain_then(state: GatewayState, then: Callable[[], None]) -> None:
    """Drain, then `then()` (the server's own shutdown). Until the drain ends (every run in
    flight done, or stopped at the grace period) the server keeps listening, so a new request
    gets 503 `shutting_down` and `/ready` 503, which a load balancer retries elsewhere, rather
    than a refused connection. A second signal, with the drain under way, goes on at once."""
    if state.lifecycle.is_draining:
        then()
        return
    drain = state.lifecycle.begin_drain(state.settings.shutdown_grace_s)
    drain.add_done_callback(lambda _: then())


def drain_then_threadsafe(app: FastAPI, then: Callable[[], None]) -> None:
    """`_drain_then` from another thread (the main thread's signal handler when uvicorn runs on
    a thread of its own: `drain_on_signals` then cannot install itself). Before the app has
    started there is nothing to drain: `then()` at once."""
    state: GatewayState | None = getattr(app.state, "gateway", None)
    loop: asyncio.AbstractEventLoop | None = getattr(app.state, "loop", None)
    if state is None or loop is None:
        then()
        return
    loop.call_soon_threadsafe(_drain_then, state, then)


def create_app(
    settings: GatewaySettings,
    *,
    handle_signals: bool = False,
    engine_client: EngineClient | None = None,
    tune_gc: bool = False,
) -> FastAPI:
    """`handle_signals`: drain on SIGTERM (`loragate serve`; tests that embed the app leave it).
    `engine_client`: an engine client built already (see build_state). `tune_gc`: once
    started, set the garbage collector up for serving (`tune_gc_for_serving`; a process that
    serves this app alone: `loragate serve`)."""

    dashboard: Dashboard | None = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await build_state(settings, engine_client)
        app.state.loop = asyncio.get_running_loop()
        app.state.gateway = state
        app.state.tenancy = state.tenancy  # the admin routers' runtime
        if tune_gc:
            tune_gc_for_serving()
        try:
            with drain_on_signals(state) if handle_signals else contextlib.nullcontext():
                yield
        finally:
            await close_state(state)
            if dashboard is not None:
                await dashboard.close()

    docs = settings.api_docs_enabled  # off: /docs and /openapi.json are 404 like any unknown path
    app = FastAPI(
        title="loragate gateway",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI from vendored files instead (gateway/api_docs/page.py)
        redoc_url=None,
        openapi_url=OPENAPI_URL if docs else None,
        swagger_ui_oauth2_redirect_url=None,
        # A redirect to the path without its slash was built from the Host header: a client
        # could point it anywhere. Such paths are a 404 instead.
        redirect_slashes=False,
        **NO_FRAMEWORK_TELEMETRY,
    )
    install_error_handlers(app)
    # The inference routes, called from just inside the edge (gateway/routes/direct.py); the
    # last middleware added is the outermost.
    inference = (chat, responses, completions, generate)
    app.add_middleware(
        DirectRoutes,
        routes=post_endpoints(module.router for module in inference),
        handlers=app.exception_handlers,
    )
    # Hosts, request context and the last-resort 500 in one pass (gateway/middleware.py).
    app.add_middleware(EdgeMiddleware, hosts=settings.trusted_hosts)
    for module in (*inference, models, health, internal):
        app.include_router(module.router)
    app.include_router(admin_router())
    if docs:
        app.include_router(docs_router(OPENAPI_URL))
    if settings.dashboard_enabled:
        dashboard = install_dashboard(app, settings)
    install_openapi(app, settings)
    return app

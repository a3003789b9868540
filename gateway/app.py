"""The gateway app factory: `create_app(settings)`; the lifespan builds everything once.

Start-up: database engine (and schema, with `auto_migrate`), quota store, key verifier (the
tenancy runtime), tokenizer, engine client(s), usage writer, metrics. Shutdown, in order: the
engines drain (in-flight requests finish and settle), the usage ledger is flushed, the stores
close.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gateway.admin import admin_router
from gateway.coordinator import Coordinator
from gateway.engine_api import EngineClient
from gateway.errors import error_json, install_error_handlers
from gateway.metrics import GatewayMetrics
from gateway.middleware import RequestContextMiddleware
from gateway.policy import PolicyService
from gateway.routes import chat, completions, generate, health, models
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.streaming import ClientGone
from gateway.tokenizer import Tokenizer
from gateway.usage_writer import UsageWriter
from tenancy.errors import TenancyError
from tenancy.migrate import upgrade
from tenancy.runtime import build_runtime

# Not a standard status: what nginx logs for a client that closed the connection first.
CLIENT_CLOSED_REQUEST = 499


async def build_engine_client(
    settings: GatewaySettings, vllm_priority: Callable[[int], int]
) -> EngineClient:
    if settings.engine_mode == "http":
        from gateway.http_engine import HttpEngineClient

        return HttpEngineClient.from_settings(settings, vllm_priority)
    from gateway.engine_client import InProcessEngineClient

    return await InProcessEngineClient.from_settings(settings)


def _ensure_sqlite_dir(url: str) -> None:
    if url.startswith("sqlite") and ":///" in url:
        path = url.split(":///", 1)[1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)


async def build_state(settings: GatewaySettings) -> GatewayState:
    _ensure_sqlite_dir(settings.database_url)
    runtime = await build_runtime(settings)
    try:
        if settings.auto_migrate:
            await upgrade(runtime.engine)
        tokenizer = await asyncio.to_thread(Tokenizer.load, settings.model)
        engine = await build_engine_client(settings, runtime.priority.vllm_priority)
    except BaseException:
        await runtime.close()
        raise
    await engine.start()
    metrics = GatewayMetrics(
        max_tenants=settings.max_metric_tenants, max_models=settings.max_metric_models
    )
    register = getattr(engine, "register_metrics", None)
    if register is not None:
        register(metrics.registry)
    usage = UsageWriter(
        runtime.sessionmaker,
        flush_interval_s=settings.usage_flush_interval_s,
        batch_size=settings.usage_batch_size,
        max_pending=settings.usage_max_pending,
    )
    usage.start()
    return GatewayState(
        settings=settings,
        tenancy=runtime,
        policy=PolicyService(
            runtime, base_model=settings.model_name, cache_ttl_s=settings.policy_cache_ttl_s
        ),
        tokenizer=tokenizer,
        engine=engine,
        coordinator=Coordinator(tokenizer, engine, settings),
        usage=usage,
        metrics=metrics,
    )


async def close_state(state: GatewayState) -> None:
    try:
        await state.engine.close()
    finally:
        try:
            await state.usage.close()
        finally:
            await state.tenancy.close()


async def _tenancy_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TenancyError)
    state: GatewayState | None = getattr(request.app.state, "gateway", None)
    if state is not None and getattr(request.state, "lg_inference", False):
        state.metrics.reject(
            getattr(request.state, "lg_tenant", None),
            getattr(request.state, "lg_model", None),
            exc.code,
        )
    return error_json(exc)


async def _client_gone(request: Request, exc: Exception) -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def create_app(settings: GatewaySettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await build_state(settings)
        app.state.gateway = state
        app.state.tenancy = state.tenancy  # the admin routers' runtime
        try:
            yield
        finally:
            await close_state(state)

    app = FastAPI(
        title="loragate gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    install_error_handlers(app)
    app.add_exception_handler(TenancyError, _tenancy_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_middleware(RequestContextMiddleware)
    for module in (chat, completions, models, generate, health):
        app.include_router(module.router)
    app.include_router(admin_router())
    return app

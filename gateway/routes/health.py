"""GET /health (liveness), /ready (database, Redis, engines) and /metrics (Prometheus)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from gateway.deps import StateDep
from gateway.state import GatewayState
from tenancy.errors import InvalidApiKey

router = APIRouter(tags=["operations"])

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 2.0


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


async def _database_ok(state: GatewayState) -> bool:
    async with state.tenancy.sessionmaker() as session:
        await session.execute(text("SELECT 1"))
    return True


async def _redis_ok(state: GatewayState) -> bool:
    redis = state.tenancy.redis
    return True if redis is None else bool(await redis.ping())


async def _check(probe: asyncio.Future[bool] | asyncio.Task[bool]) -> bool:
    with contextlib.suppress(Exception):
        return await asyncio.wait_for(probe, READY_TIMEOUT_S)
    return False


@router.get("/ready", response_model=None)
async def ready(state: StateDep) -> Response:
    database, redis = await asyncio.gather(
        _check(asyncio.ensure_future(_database_ok(state))),
        _check(asyncio.ensure_future(_redis_ok(state))),
    )
    try:
        engines = await asyncio.wait_for(state.engine.check_ready(), READY_TIMEOUT_S)
    except Exception as exc:  # a readiness probe answers "not ready" whatever broke; never a 500
        logger.warning("engine readiness check failed: %s", type(exc).__name__)
        engines = {}
    checks = {"database": database, "redis": redis, "engines": any(engines.values())}
    ok = all(checks.values())
    return JSONResponse(
        {"status": "ready" if ok else "not ready", "checks": checks, "engines": engines},
        status_code=200 if ok else 503,
    )


@router.get("/metrics", response_model=None)
async def metrics(
    state: StateDep, authorization: Annotated[str | None, Header()] = None
) -> Response:
    token = state.settings.metrics_token
    if token is not None:
        expected = f"Bearer {token.get_secret_value()}".encode()
        if not hmac.compare_digest((authorization or "").encode(), expected):
            raise InvalidApiKey()
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

"""GET /health (liveness), /ready (database, Redis, engines) and /metrics (Prometheus)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Coroutine
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from gateway.deps import StateDep
from gateway.engines.api import EngineClient
from gateway.state import GatewayState
from tenancy.errors import InvalidApiKey
from tenancy.sql.migrate import current_revision, head_revision

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


async def _schema_ok(state: GatewayState) -> bool:
    """The schema is at this code's revision (else every request would fail)."""
    current = await current_revision(state.tenancy.engine)
    if current != head_revision():
        logger.warning("database schema at %s, needs %s: run `loragate admin migrate`",
                       current, head_revision())  # fmt: skip
        return False
    return True


async def _redis_ok(state: GatewayState) -> bool:
    redis = state.tenancy.redis
    assert redis is not None
    return bool(await redis.ping())


async def _check(probe: Coroutine[None, None, bool]) -> bool:
    with contextlib.suppress(Exception):
        return await asyncio.wait_for(probe, READY_TIMEOUT_S)
    return False


async def _engines_ready(name: str, engine: EngineClient) -> dict[str, bool]:
    try:
        return await asyncio.wait_for(engine.check_ready(), READY_TIMEOUT_S)
    except Exception as exc:  # a readiness probe answers "not ready" whatever broke; never a 500
        logger.warning("engine readiness check failed (%s): %s", name, type(exc).__name__)
        return {}


@router.get("/ready", response_model=None)
async def ready(state: StateDep) -> Response:
    """`checks`: each dependency this gateway uses; one not configured is `null` and does not
    count (no Redis in the embedded mode). `status` is `draining` (503) once shutdown began."""
    uses_redis = state.tenancy.redis is not None
    database, schema, redis = await asyncio.gather(
        _check(_database_ok(state)),
        _check(_schema_ok(state)),
        _check(_redis_ok(state)) if uses_redis else asyncio.sleep(0, None),
    )
    pools = state.engines()
    answers = await asyncio.gather(*(_engines_ready(name, e) for name, e in pools.items()))
    # The primary's replicas under their own names (as with one model); another model's as
    # `model/replica`. Ready: every model has a ready replica.
    engines = dict(answers[0])
    for name, replicas in zip(list(pools)[1:], answers[1:], strict=True):
        engines |= {f"{name}/{replica}": ok for replica, ok in replicas.items()}
    checks = {
        "database": database,
        "schema": schema,
        "redis": redis if uses_redis else None,
        "engines": all(any(replicas.values()) for replicas in answers),
    }
    ok = all(value for value in checks.values() if value is not None)
    # Draining (SIGTERM): not ready, so the balancer stops sending while requests in flight end.
    status = "draining" if state.lifecycle.is_draining else "ready" if ok else "not ready"
    ok = ok and not state.lifecycle.is_draining
    return JSONResponse(
        {"status": status, "checks": checks, "engines": engines},
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

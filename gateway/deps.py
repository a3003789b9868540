"""Annotated dependencies of the inference routes. Authentication is a dependency on each route
(never a path test in a middleware), so no Host or path trick can route around it."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Request

from engine.protocol import BodyTooLarge as TooLarge
from engine.protocol import read_capped
from gateway.errors import BodyTooLarge
from gateway.policy import TenantContext
from gateway.state import GatewayState
from gateway.telemetry.tracing import route_of
from tenancy.errors import ClientError


async def get_state(request: Request) -> GatewayState:
    # async: FastAPI runs a sync dependency in a worker thread, which costs more than this.
    state: GatewayState = request.app.state.gateway
    return state


StateDep = Annotated[GatewayState, Depends(get_state)]


async def get_tenant(request: Request, state: StateDep) -> TenantContext:
    request.state.lg_inference = True  # rejections from here on are counted in the metrics
    tracing = state.tracing
    began = time.perf_counter() if tracing is not None else 0.0
    try:
        ctx = await state.policy.authenticate(request.headers.get("authorization"))
    except ClientError as exc:
        if tracing is not None:
            tracing.refused_at_auth(
                started=request.state.started,
                auth_began=began,
                path=route_of(request.scope),
                error=exc,
            )
        raise
    if tracing is not None:  # the request's trace begins once it is planned (lifecycle)
        request.state.lg_auth = (began, time.perf_counter())
    request.state.lg_tenant = ctx.tenant_id
    request.state.lg_key = ctx.key_id
    return ctx


TenantDep = Annotated[TenantContext, Depends(get_tenant)]


async def read_body(request: Request, state: StateDep) -> bytes:
    """The raw body, refused with 413 as soon as it is known to pass the limit."""
    try:
        return await read_capped(
            request.stream(),
            declared=request.headers.get("content-length"),
            limit=state.settings.max_body_bytes,
        )
    except TooLarge as exc:
        raise BodyTooLarge(exc.limit) from None


BodyDep = Annotated[bytes, Depends(read_body)]

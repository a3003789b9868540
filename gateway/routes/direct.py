"""The inference routes called straight from the edge, without FastAPI's router (issue 48).

Every inference route has one shape: `POST path`, `(request, state, ctx, raw) -> Response`,
with the tenant from `get_tenant` and the capped body from `read_body` (gateway/deps.py). For
those, FastAPI's machinery (exception-telemetry and exception middleware, the exit stack, the
router's walk over every route, the request/response wrappers, dependency solving) was a fifth
of a request's CPU on the gateway benchmark and did nothing the route needs. `DirectRoutes`
sits just inside `EdgeMiddleware` and calls those endpoints itself, with the same dependency
functions and the same exception handlers as the app (`app.exception_handlers`, looked up by
the exception's class hierarchy as Starlette does). Everything else, and these paths with any
other method, goes on to FastAPI unchanged.

The routes stay declared on their routers (`gateway/routes/*.py`): that is where OpenAPI and
the docs read them, and the table here is built from those declarations, so the two cannot
drift.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.deps import get_state, get_tenant, read_body
from gateway.policy import TenantContext
from gateway.state import GatewayState

Endpoint = Callable[[Request, GatewayState, TenantContext, bytes], Awaitable[Response]]
# Starlette's handler table: (request, exc) -> a Response, or an awaitable of one.
Handler = Callable[[Request, Exception], Any]


def post_endpoints(routers: Iterable[APIRouter]) -> dict[str, Endpoint]:
    """Path -> endpoint for every POST route of `routers` (the inference routers: each takes
    request, state, tenant and raw body, as `Endpoint` says)."""
    table: dict[str, Endpoint] = {}
    for router in routers:
        for route in router.routes:
            if isinstance(route, APIRoute) and route.methods == {"POST"}:
                table[route.path] = route.endpoint
    return table


class DirectRoutes:
    def __init__(
        self, app: ASGIApp, *, routes: dict[str, Endpoint], handlers: Mapping[Any, Handler]
    ) -> None:
        self.app = app
        self._routes = routes
        # The app's own table, by reference: handlers added later are seen too.
        self._handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = (
            self._routes.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        request: Request = Request(scope, receive, send)
        try:
            state = await get_state(request)
            ctx = await get_tenant(request, state)
            raw = await read_body(request, state)
            response = await endpoint(request, state, ctx, raw)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise  # the edge's last resort: a constant 500
            answer = handler(request, exc)
            if inspect.isawaitable(answer):  # the gateway's handlers are all async
                answer = await answer
            await answer(scope, receive, send)
            exc.__traceback__ = None  # an exception instance may be reused
            return
        # Sending is not wrapped: the gateway's responses raise nothing before their first
        # message, and once it is out a failure can only cut the answer (the edge's part).
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Handler | None:
        for cls in type(exc).__mro__:
            if cls in self._handlers and cls is not Exception:  # that one is the edge's
                return self._handlers[cls]
        return None

"""The one place an exception becomes an HTTP answer, always in the OpenAI error shape:
`{"error": {"message", "type", "param", "code"}}`.

- `ClientError` (tenancy/errors.py, the one base of every error a client can cause, for the
  admin API and inference alike) answers its own status, code and headers; on an inference
  route it also counts as a rejection in the metrics, by its code.
- Request validation errors are a 400 naming the field, never quoting the value (it may be a
  key); database errors a 503 `database_unavailable`.
- Unknown routes (404 `unknown_route`) and wrong methods (405 `method_not_allowed`, with the
  `Allow` header) too.
- A client that left (ClientGone, Starlette's ClientDisconnect mid-body) is 499 and one INFO line.
- Anything else is a bug: a constant 500, logged by type and frames only (a message may quote
  request data). It is caught by a middleware rather than an `Exception` handler, which
  Starlette re-raises after answering (uvicorn would then log the whole exception).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from gateway.errors import ClientGone
from gateway.telemetry.rejections import record_rejection
from tenancy.errors import BadRequest, ClientError, DatabaseUnavailable

log = logging.getLogger(__name__)

# Not a standard status: what nginx logs for a client that closed the connection first.
CLIENT_CLOSED_REQUEST = 499


def error_response(exc: ClientError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)


async def _client_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ClientError)
    state = getattr(request.app.state, "gateway", None)
    if state is not None and getattr(request.state, "lg_inference", False):
        tenant = getattr(request.state, "lg_tenant", None)
        reason = state.metrics.reject(tenant, getattr(request.state, "lg_model", None), exc.code)
        if tenant is not None:  # the quota-state API and the dashboard show the last hour
            await record_rejection(
                state.tenancy.rejections, tenant, getattr(request.state, "lg_key", None), reason
            )
    return error_response(exc)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    message = f"Invalid value for {param or 'the request'}: {first.get('msg', 'invalid')}."
    return error_response(BadRequest(message, param=param))


async def _database_error(request: Request, exc: Exception) -> Response:
    log.warning("database error on %s: %s", request.url.path, type(exc).__name__)
    return error_response(DatabaseUnavailable())


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own answers (no such route, wrong method, ...), in the OpenAI shape."""
    assert isinstance(exc, HTTPException)
    codes = {404: "unknown_route", 405: "method_not_allowed"}
    messages = {
        404: f"Unknown route: {request.method} {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }
    error = ClientError(
        message=messages.get(exc.status_code, str(exc.detail)),
        status_code=exc.status_code,
        code=codes.get(exc.status_code),
        headers=dict(exc.headers or {}),
    )
    return error_response(error)


async def _client_gone(request: Request, exc: Exception) -> Response:
    # The common case, not an error: one INFO line, no traceback (its run keeps the books).
    log.info("client left before its response (%s)", request.url.path)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ClientError, _client_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(OperationalError, _database_error)
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(ClientDisconnect, _client_gone)

"""Typed errors a client can cause, and the one place every error becomes the OpenAI shape.

Body: `{"error": {"message", "type", "param", "code"}}`. Messages never quote a key, a salt, a
prompt or another tenant's data; unexpected exceptions are logged by type only and answered
with a constant 500.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gateway.admin import install_error_handlers as install_admin_error_handlers
from tenancy.errors import TenancyError

log = logging.getLogger(__name__)


class GatewayError(TenancyError):
    """Shares the tenancy errors' shape, so one handler answers both."""


class BadRequest(GatewayError):
    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(
            message=message, status_code=400, code=code or "invalid_value", param=param
        )


class UnsupportedField(BadRequest):
    def __init__(self, field: str) -> None:
        super().__init__(
            f"{field} is not supported by this server.", param=field, code="unsupported_parameter"
        )


class ContextLengthExceeded(BadRequest):
    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message, param=param, code="context_length_exceeded")


class BodyTooLarge(GatewayError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            message=f"The request body is larger than {limit} bytes.",
            status_code=413,
            code="request_too_large",
        )


class ModelNotFound(GatewayError):
    """An unknown model, or an adapter this key may not see: the same answer for both."""

    def __init__(self) -> None:
        super().__init__(
            message="The model does not exist or you do not have access to it.",
            status_code=404,
            code="model_not_found",
            param="model",
        )


class EngineOverloaded(GatewayError):
    def __init__(self, message: str = "The engine is overloaded; retry shortly.") -> None:
        super().__init__(
            message=message,
            status_code=503,
            error_type="server_error",
            code="overloaded",
            headers={"retry-after": "1"},
        )


class ShuttingDown(GatewayError):
    """This gateway is draining: retry on another replica (or after its restart)."""

    def __init__(self, message: str = "The gateway is shutting down; retry the request.") -> None:
        super().__init__(
            message=message,
            status_code=503,
            error_type="server_error",
            code="shutting_down",
            headers={"retry-after": "1"},
        )


class EngineFailed(GatewayError):
    """The engine (or every replica tried) failed: 500 for our own engine, 502 upstream."""

    def __init__(self, message: str = "The engine failed.", *, status_code: int = 500) -> None:
        super().__init__(
            message=message, status_code=status_code, error_type="server_error", code="engine_error"
        )


class Unauthorized(GatewayError):
    def __init__(self) -> None:
        super().__init__(
            message="Incorrect API key provided.",
            status_code=401,
            code="invalid_api_key",
        )


class ClientGone(Exception):
    """The client disconnected before its response started (answered 499, never sent)."""


def error_json(exc: TenancyError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled %s on %s", type(exc).__name__, request.url.path)
    return error_json(
        GatewayError(message="Internal server error.", status_code=500, error_type="server_error")
    )


def install_error_handlers(app: FastAPI) -> None:
    """Tenancy errors (and gateway errors, their subclasses), validation and database errors go
    through the admin module's mapping; anything else is a constant 500."""
    install_admin_error_handlers(app)
    app.add_exception_handler(Exception, _unexpected)

"""The errors only the gateway raises, each with its OpenAI error shape (`tenancy.errors.ClientError`
is their base, shared with the tenancy layer); error_handlers.py maps them to answers.

Messages never quote a key, a salt, a prompt or another tenant's data.
"""

from __future__ import annotations

from tenancy.errors import BadRequest, ClientError


class UnsupportedField(BadRequest):
    def __init__(self, field: str) -> None:
        super().__init__(
            f"{field} is not supported by this server.", param=field, code="unsupported_parameter"
        )


class ContextLengthExceeded(BadRequest):
    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message, param=param, code="context_length_exceeded")


class BodyTooLarge(ClientError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            message=f"The request body is larger than {limit} bytes.",
            status_code=413,
            code="request_too_large",
        )


class ModelNotFound(ClientError):
    """An unknown model, or an adapter this key may not see: the same answer for both."""

    def __init__(self) -> None:
        super().__init__(
            message="The model does not exist or you do not have access to it.",
            status_code=404,
            code="model_not_found",
            param="model",
        )


class EngineOverloaded(ClientError):
    def __init__(self, message: str = "The engine is overloaded; retry shortly.") -> None:
        super().__init__(
            message=message,
            status_code=503,
            error_type="server_error",
            code="overloaded",
            headers={"retry-after": "1"},
        )


class ShuttingDown(ClientError):
    """This gateway is draining: retry on another replica (or after its restart)."""

    def __init__(self, message: str = "The gateway is shutting down; retry the request.") -> None:
        super().__init__(
            message=message,
            status_code=503,
            error_type="server_error",
            code="shutting_down",
            headers={"retry-after": "1"},
        )


class EngineFailed(ClientError):
    """The engine (or every replica tried) failed: 500 for our own engine, 502 upstream."""

    def __init__(self, message: str = "The engine failed.", *, status_code: int = 500) -> None:
        super().__init__(
            message=message, status_code=status_code, error_type="server_error", code="engine_error"
        )


class ClientGone(Exception):
    """The client disconnected before its response started (answered 499, never sent)."""

"""Typed errors a client can cause, mapped once to HTTP statuses at the server boundary."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine reports to a caller."""

    status_code = 500
    error_type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequestError(EngineError):
    """Bad input: 400 naming the offending field in `param`."""

    status_code = 400
    error_type = "invalid_request_error"


class AdapterNotFoundError(EngineError):
    """`model` names no loaded adapter: 404."""

    status_code = 404
    error_type = "invalid_request_error"


class EngineUnavailableError(EngineError):
    """Draining, dead or overloaded past the queue limit: 503."""

    status_code = 503
    error_type = "server_error"


class RequestTooLargeError(EngineError):
    """The body is over the server's size limit: 413."""

    status_code = 413
    error_type = "invalid_request_error"


class AdminAuthError(EngineError):
    """The adapter endpoints need the engine's admin token: 401."""

    status_code = 401
    error_type = "authentication_error"

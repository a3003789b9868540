"""Typed errors a client can cause, for the admin API and inference alike. `ClientError` is the
one base (the gateway's own errors extend it too); each carries its OpenAI error shape, and
gateway/error_handlers.py maps them to answers, once.

The message never contains a key, a salt or another tenant's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ClientError(Exception):
    message: str
    status_code: int = 400
    error_type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidApiKey(ClientError):
    def __init__(self) -> None:
        # One constant message for every failure, so a caller learns nothing about why.
        super().__init__(
            message="Incorrect API key provided.",
            status_code=401,
            error_type="invalid_request_error",
            code="invalid_api_key",
        )


class InsufficientScope(ClientError):
    def __init__(self, message: str = "This key lacks the scope for this operation.") -> None:
        super().__init__(
            message=message,
            status_code=403,
            error_type="permission_error",
            code="insufficient_scope",
        )


class TenantSuspended(ClientError):
    def __init__(self) -> None:
        super().__init__(
            message="This key's tenant is suspended; ask its administrator.",
            status_code=403,
            error_type="permission_error",
            code="tenant_suspended",
        )


class NotFound(ClientError):
    def __init__(self, what: str) -> None:
        super().__init__(message=f"{what} not found.", status_code=404, code="not_found")


class Conflict(ClientError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message=message, status_code=409, code="conflict", param=param)


class BadRequest(ClientError):
    def __init__(self, message: str, *, code: str = "invalid_value", param: str | None = None):
        super().__init__(message=message, status_code=400, code=code, param=param)


class ServiceUnavailable(ClientError):
    """A backing service is down: fail closed with 503 and `Retry-After`, never 401.

    Each service has its own code (and so its own rejection metric), so clients and alerts can
    tell a database outage from a quota-store outage from an overloaded engine.
    """

    def __init__(self, what: str, *, code: str, retry_after_s: int = 1) -> None:
        super().__init__(
            message=f"{what} is temporarily unavailable.",
            status_code=503,
            error_type="server_error",
            code=code,
            headers={"retry-after": str(retry_after_s)},
        )


class DatabaseUnavailable(ServiceUnavailable):
    def __init__(self, what: str = "The database") -> None:
        super().__init__(what, code="database_unavailable")


class QuotaStoreUnavailable(ServiceUnavailable):
    def __init__(self) -> None:
        super().__init__("The quota store", code="quota_store_unavailable")


class IdentityProviderUnavailable(ServiceUnavailable):
    def __init__(self) -> None:
        super().__init__("The identity provider", code="identity_provider_unavailable")

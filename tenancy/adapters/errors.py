"""The one error an upload can fail with: a 400 that names the problem."""

from __future__ import annotations

from tenancy.errors import BadRequest


class AdapterRejected(BadRequest):
    def __init__(self, message: str, *, param: str = "file") -> None:
        super().__init__(message, code="invalid_adapter", param=param)

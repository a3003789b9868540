"""The one place tenancy errors become OpenAI-shaped responses."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError

from tenancy.errors import BadRequest, DatabaseUnavailable, TenancyError


def _respond(exc: TenancyError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)


async def _tenancy_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TenancyError)
    return _respond(exc)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    # The input value is left out: it may be a key.
    message = f"Invalid value for {'.'.join(loc) or 'the request'}: {first.get('msg', 'invalid')}."
    return _respond(BadRequest(message, param=".".join(loc) or None))


async def _database_error(_: Request, exc: Exception) -> JSONResponse:
    return _respond(DatabaseUnavailable())


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(TenancyError, _tenancy_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(OperationalError, _database_error)
    app.add_exception_handler(DBAPIError, _database_error)

"""Annotated dependencies of the admin routes. Authentication is a dependency on each route."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.admin_auth import authenticate
from tenancy.principal import AuditContext, Principal
from tenancy.runtime import TenancyRuntime


def get_runtime(request: Request) -> TenancyRuntime:
    runtime: TenancyRuntime = request.app.state.tenancy
    return runtime


RuntimeDep = Annotated[TenancyRuntime, Depends(get_runtime)]


async def get_session(runtime: RuntimeDep) -> AsyncIterator[AsyncSession]:
    async with runtime.sessionmaker() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


async def get_principal(
    runtime: RuntimeDep, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    return await authenticate(
        authorization,
        keys=runtime.keys,
        key_prefix=runtime.settings.key_prefix,
        oidc=runtime.oidc,
    )


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_audit_context(request: Request, principal: PrincipalDep) -> AuditContext:
    request_id = request.headers.get("x-request-id")
    return AuditContext(
        principal=principal,
        request_id=request_id[:128] if request_id else None,
        client_addr=request.client.host if request.client else None,
    )


AuditDep = Annotated[AuditContext, Depends(get_audit_context)]

"""Annotated dependencies of the admin routes. Authentication is a dependency on each route."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.middleware import sane_request_id
from gateway.state import GatewayState
from tenancy.auth.admin import authenticate
from tenancy.auth.principal import AuditContext, Principal
from tenancy.runtime import TenancyRuntime


def get_runtime(request: Request) -> TenancyRuntime:
    runtime: TenancyRuntime = request.app.state.tenancy
    return runtime


RuntimeDep = Annotated[TenancyRuntime, Depends(get_runtime)]


async def get_session(runtime: RuntimeDep) -> AsyncIterator[AsyncSession]:
    async with runtime.sessionmaker() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


class AdapterRemoval:
    """What changing adapters must tell the serving side: its cached adapter catalogs are
    stale, and (for deleted versions) no engine may keep them (their files are gone)."""

    def __init__(self, state: GatewayState | None) -> None:
        self._state = state  # None where the admin routers run without the gateway

    def changed(self) -> None:
        """A version was added or an alias changed: this process resolves names afresh from
        now on (the others within their policy cache TTL)."""
        if self._state is not None:
            self._state.policy.forget_adapters()

    def removed(self, engine_names: list[str]) -> None:
        if self._state is None or not engine_names:
            return
        self._state.policy.forget_adapters()
        # Every pool: an engine that never loaded it has nothing to drop (cheap), and the
        # deleted row no longer says which base model it was on.
        for engine in self._state.engines().values():
            for name in engine_names:
                engine.start_unload(name)


def get_adapter_removal(request: Request) -> AdapterRemoval:
    return AdapterRemoval(getattr(request.app.state, "gateway", None))


AdapterRemovalDep = Annotated[AdapterRemoval, Depends(get_adapter_removal)]


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
    # The id the middleware settled on (the response carries the same), never the raw header;
    # the address is the peer's, or a trusted proxy's X-Forwarded-For (the server decides).
    request_id = getattr(request.state, "request_id", None)
    if request_id is None:  # an app without the middleware (the admin routers alone)
        request_id = sane_request_id(request.headers.get("x-request-id", "").encode() or None)
    return AuditContext(
        principal=principal,
        request_id=request_id,
        client_addr=request.client.host if request.client else None,
    )


AuditDep = Annotated[AuditContext, Depends(get_audit_context)]

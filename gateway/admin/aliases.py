"""/admin/v1/tenants/{tenant_id}/adapter-aliases (a tenant's) and /admin/v1/adapter-aliases
(public ones, changed by the admin only): read an alias, switch it to a version (a rollback is a
switch), set or clear a canary, delete it (with every version of its name, if asked).

Each change takes effect on this gateway process at once and on the others within their policy
cache TTL (LORAGATE_POLICY_CACHE_TTL_S); requests already admitted keep the version they got.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.admin.deps import (
    AdapterRemoval,
    AdapterRemovalDep,
    AuditDep,
    PrincipalDep,
    RuntimeDep,
    SessionDep,
)
from tenancy.auth.principal import AuditContext
from tenancy.crud import adapters as versions
from tenancy.crud import aliases as crud
from tenancy.runtime import TenancyRuntime
from tenancy.schemas import AliasOut, AliasSwitch, CanaryIn

router = APIRouter(tags=["adapters"])

WithVersions = Annotated[
    bool,
    Query(description="also delete every version of the name (none may be left in use)"),
]
TENANT = "/tenants/{tenant_id}/adapter-aliases"
PUBLIC = "/adapter-aliases"


@router.get(TENANT, response_model=list[AliasOut])
async def list_aliases(tenant_id: str, session: SessionDep, principal: PrincipalDep) -> object:
    return await crud.list_aliases(session, principal=principal, tenant_id=tenant_id)


@router.get(PUBLIC, response_model=list[AliasOut])
async def list_public_aliases(session: SessionDep, principal: PrincipalDep) -> object:
    return await crud.list_aliases(session, principal=principal, tenant_id=None)


@router.get(TENANT + "/{name}", response_model=AliasOut)
async def get_alias(
    tenant_id: str, name: str, session: SessionDep, principal: PrincipalDep
) -> object:
    return await crud.get_alias(session, principal=principal, tenant_id=tenant_id, name=name)


@router.get(PUBLIC + "/{name}", response_model=AliasOut)
async def get_public_alias(name: str, session: SessionDep, principal: PrincipalDep) -> object:
    return await crud.get_alias(session, principal=principal, tenant_id=None, name=name)


@router.put(TENANT + "/{name}", response_model=AliasOut)
async def switch_alias(
    tenant_id: str,
    name: str,
    body: AliasSwitch,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    removal: AdapterRemovalDep,
) -> object:
    return await _switch(session, ctx, runtime, removal, tenant_id, name, body.version)


@router.put(PUBLIC + "/{name}", response_model=AliasOut)
async def switch_public_alias(
    name: str,
    body: AliasSwitch,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    removal: AdapterRemovalDep,
) -> object:
    return await _switch(session, ctx, runtime, removal, None, name, body.version)


@router.put(TENANT + "/{name}/canary", response_model=AliasOut)
async def set_canary(
    tenant_id: str,
    name: str,
    body: CanaryIn,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    removal: AdapterRemovalDep,
) -> object:
    return await _canary(session, ctx, runtime, removal, tenant_id, name, body)


@router.put(PUBLIC + "/{name}/canary", response_model=AliasOut)
async def set_public_canary(
    name: str,
    body: CanaryIn,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    removal: AdapterRemovalDep,
) -> object:
    return await _canary(session, ctx, runtime, removal, None, name, body)


async def _switch(
    session: AsyncSession,
    ctx: AuditContext,
    runtime: TenancyRuntime,
    removal: AdapterRemoval,
    tenant_id: str | None,
    name: str,
    version: int,
) -> object:
    """A tenant's alias or (tenant_id None) a public one, pointed at `version`."""
    out = await crud.switch_alias(
        session, ctx=ctx, tenant_id=tenant_id, name=name, version=version,
        serving_model=runtime.adapters.serving_model,
    )  # fmt: skip
    removal.changed()
    return out


async def _canary(
    session: AsyncSession,
    ctx: AuditContext,
    runtime: TenancyRuntime,
    removal: AdapterRemoval,
    tenant_id: str | None,
    name: str,
    body: CanaryIn,
) -> object:
    """The same with a canary version at `body.weight`."""
    out = await crud.set_canary(
        session, ctx=ctx, tenant_id=tenant_id, name=name, version=body.version,
        weight=body.weight, serving_model=runtime.adapters.serving_model,
    )  # fmt: skip
    removal.changed()
    return out


@router.delete(TENANT + "/{name}/canary", response_model=AliasOut)
async def clear_canary(
    tenant_id: str, name: str, session: SessionDep, ctx: AuditDep, removal: AdapterRemovalDep
) -> object:
    out = await crud.clear_canary(session, ctx=ctx, tenant_id=tenant_id, name=name)
    removal.changed()
    return out


@router.delete(PUBLIC + "/{name}/canary", response_model=AliasOut)
async def clear_public_canary(
    name: str, session: SessionDep, ctx: AuditDep, removal: AdapterRemovalDep
) -> object:
    out = await crud.clear_canary(session, ctx=ctx, tenant_id=None, name=name)
    removal.changed()
    return out


@router.delete(TENANT + "/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_alias(
    tenant_id: str,
    name: str,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    removal: AdapterRemovalDep,
    with_versions: WithVersions = False,
) -> None:
    removed = await versions.delete_name(
        session, ctx=ctx, service=runtime.adapters, tenant_id=tenant_id, name=name,
        with_versions=with_versions,
    )  # fmt: skip
    removal.changed()
    removal.removed(removed)


@router.delete(PUBLIC + "/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_public_alias(
    name: str,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    removal: AdapterRemovalDep,
    with_versions: WithVersions = False,
) -> None:
    removed = await versions.delete_name(
        session, ctx=ctx, service=runtime.adapters, tenant_id=None, name=name,
        with_versions=with_versions,
    )  # fmt: skip
    removal.changed()
    removal.removed(removed)

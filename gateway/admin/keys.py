"""/admin/v1/tenants/{tenant_id}/keys: the clear key appears only in create and rotate."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Response, status
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.admin.deps import AuditDep, PrincipalDep, RuntimeDep, SessionDep
from tenancy.auth.principal import AuditContext
from tenancy.crud import keys as crud
from tenancy.runtime import TenancyRuntime
from tenancy.schemas import ApiKeyCreate, ApiKeyCreated, ApiKeyOut, ApiKeyRotate
from tenancy.sql.models import ApiKey

router = APIRouter(prefix="/tenants/{tenant_id}/keys", tags=["keys"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ApiKeyCreated)
async def create_key(
    tenant_id: str,
    body: ApiKeyCreate,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    response: Response,
) -> object:
    response.headers["cache-control"] = "no-store"
    return await crud.create_key(
        session, ctx=ctx, minter=runtime.minter, tenant_id=tenant_id, data=body, now=runtime.now()
    )


@router.get("", response_model=list[ApiKeyOut])
async def list_keys(tenant_id: str, session: SessionDep, principal: PrincipalDep) -> object:
    return await crud.list_keys(session, principal=principal, tenant_id=tenant_id)


@router.post("/{key_id}/rotate", response_model=ApiKeyCreated)
async def rotate_key(
    tenant_id: str,
    key_id: str,
    body: ApiKeyRotate,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    response: Response,
) -> object:
    response.headers["cache-control"] = "no-store"
    return await rotate(
        session, ctx=ctx, runtime=runtime, tenant_id=tenant_id, key_id=key_id,
        grace_s=body.grace_seconds,
    )  # fmt: skip


@router.post("/{key_id}/revoke", response_model=ApiKeyOut)
async def revoke_key(
    tenant_id: str, key_id: str, session: SessionDep, ctx: AuditDep, runtime: RuntimeDep
) -> object:
    return await revoke(session, ctx=ctx, runtime=runtime, tenant_id=tenant_id, key_id=key_id)


# What rotating and revoking take beyond the row: the key cache must forget the old key on every
# replica. The API's routes and the dashboard's forms both call these.


async def rotate(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    runtime: TenancyRuntime,
    tenant_id: str,
    key_id: str,
    grace_s: float | None,
) -> ApiKeyCreated:
    """The old key keeps working for `grace_s` (None: the configured default)."""
    grace = dt.timedelta(
        seconds=runtime.settings.default_rotation_grace_s if grace_s is None else grace_s
    )
    created = await crud.rotate_key(
        session, ctx=ctx, minter=runtime.minter, tenant_id=tenant_id, key_id=key_id,
        grace=grace, now=runtime.now(),
    )  # fmt: skip
    await runtime.keys.invalidate(key_id=key_id)
    return created


async def revoke(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    runtime: TenancyRuntime,
    tenant_id: str,
    key_id: str,
) -> ApiKey:
    row = await crud.revoke_key(
        session, ctx=ctx, tenant_id=tenant_id, key_id=key_id, now=runtime.now()
    )
    await runtime.keys.invalidate(key_id=key_id)
    return row

"""/admin/v1/tenants"""

from __future__ import annotations

from fastapi import APIRouter, status
from pydantic import computed_field
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.admin.deps import (
    AdapterRemovalDep,
    AuditDep,
    PrincipalDep,
    RuntimeDep,
    SessionDep,
)
from gateway.telemetry.metrics import tenant_series_label
from tenancy.auth.principal import AuditContext
from tenancy.crud import tenants as crud
from tenancy.runtime import TenancyRuntime
from tenancy.schemas import TenantCreate, TenantOut, TenantUpdate
from tenancy.sql.models import Tenant

router = APIRouter(prefix="/tenants", tags=["tenants"])


class TenantView(TenantOut):
    """A tenant as the admin API answers, with the label its series carry on /metrics (tenancy
    may not import the engine's digest, so the gateway adds it here)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def metrics_label(self) -> str:
        return tenant_series_label(self.id)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TenantView)
async def create_tenant(
    body: TenantCreate, session: SessionDep, ctx: AuditDep, runtime: RuntimeDep
) -> object:
    return await crud.create_tenant(
        session, ctx=ctx, data=body, tiers=runtime.tier_names,
        default_tier=runtime.settings.default_tier,
    )  # fmt: skip


@router.get("", response_model=list[TenantView])
async def list_tenants(session: SessionDep, principal: PrincipalDep) -> object:
    return await crud.list_tenants(session, principal=principal)


@router.get("/{tenant_id}", response_model=TenantView)
async def get_tenant(tenant_id: str, session: SessionDep, principal: PrincipalDep) -> object:
    return await crud.load_tenant(session, principal=principal, tenant_id=tenant_id)


@router.patch("/{tenant_id}", response_model=TenantView)
async def update_tenant(
    tenant_id: str, body: TenantUpdate, session: SessionDep, ctx: AuditDep, runtime: RuntimeDep
) -> object:
    return await update(session, ctx=ctx, runtime=runtime, tenant_id=tenant_id, data=body)


async def update(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    runtime: TenancyRuntime,
    tenant_id: str,
    data: TenantUpdate,
) -> Tenant:
    """The API's PATCH and the dashboard's suspend/reactivate: the row, then the key cache on
    every replica (a key's tenant status and tier live in it)."""
    tenant = await crud.update_tenant(
        session, ctx=ctx, tenant_id=tenant_id, data=data, tiers=runtime.tier_names
    )
    await runtime.keys.invalidate(tenant_id=tenant_id)
    return tenant


@router.delete("/{tenant_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_tenant(
    tenant_id: str,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    removal: AdapterRemovalDep,
) -> None:
    adapters = await crud.delete_tenant(
        session, ctx=ctx, tenant_id=tenant_id, service=runtime.adapters
    )
    await runtime.keys.invalidate(tenant_id=tenant_id)
    removal.removed(adapters)  # its adapters' files went with it


@router.post("/{tenant_id}/salt/rotate", response_model=TenantView)
async def rotate_salt(
    tenant_id: str, session: SessionDep, ctx: AuditDep, runtime: RuntimeDep
) -> object:
    tenant = await crud.rotate_salt(session, ctx=ctx, tenant_id=tenant_id)
    await runtime.keys.invalidate(tenant_id=tenant_id)
    return tenant

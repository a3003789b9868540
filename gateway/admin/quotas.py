"""/admin/v1/tenants/{tenant_id}/quotas and .../keys/{key_id}/quotas"""

from __future__ import annotations

from fastapi import APIRouter

from gateway.admin.deps import AuditDep, PrincipalDep, SessionDep
from tenancy.crud import quotas as crud
from tenancy.schemas import QuotaLimitsIn, QuotaPolicyOut

router = APIRouter(prefix="/tenants/{tenant_id}", tags=["quotas"])


@router.get("/quotas", response_model=QuotaPolicyOut)
async def get_tenant_quotas(tenant_id: str, session: SessionDep, principal: PrincipalDep) -> object:
    return await crud.get_policy(session, principal=principal, tenant_id=tenant_id)


@router.put("/quotas", response_model=QuotaPolicyOut)
async def put_tenant_quotas(
    tenant_id: str, body: QuotaLimitsIn, session: SessionDep, ctx: AuditDep
) -> object:
    return await crud.put_policy(session, ctx=ctx, tenant_id=tenant_id, limits=body)


@router.get("/keys/{key_id}/quotas", response_model=QuotaPolicyOut)
async def get_key_quotas(
    tenant_id: str, key_id: str, session: SessionDep, principal: PrincipalDep
) -> object:
    return await crud.get_policy(session, principal=principal, tenant_id=tenant_id, key_id=key_id)


@router.put("/keys/{key_id}/quotas", response_model=QuotaPolicyOut)
async def put_key_quotas(
    tenant_id: str, key_id: str, body: QuotaLimitsIn, session: SessionDep, ctx: AuditDep
) -> object:
    return await crud.put_policy(session, ctx=ctx, tenant_id=tenant_id, limits=body, key_id=key_id)

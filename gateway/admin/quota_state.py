"""/admin/v1/tenants/{tenant_id}/quota-state and .../keys/{key_id}/quota-state: live numbers
from the quota store that admits requests (tenancy/quota/state.py)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.admin.deps import PrincipalDep, RuntimeDep, SessionDep
from tenancy.quota.state import QuotaStateOut, quota_state

router = APIRouter(prefix="/tenants/{tenant_id}", tags=["quotas"])


@router.get(
    "/quota-state",
    response_model=QuotaStateOut,
    summary="A tenant's live quota state",
)
async def get_tenant_quota_state(
    tenant_id: str, session: SessionDep, principal: PrincipalDep, runtime: RuntimeDep
) -> object:
    return await quota_state(
        session, principal=principal, quotas=runtime.quotas, rejections=runtime.rejections,
        tenant_id=tenant_id, now=runtime.now(),
    )  # fmt: skip


@router.get(
    "/keys/{key_id}/quota-state",
    response_model=QuotaStateOut,
    summary="A key's live quota state (its own policy's counters)",
)
async def get_key_quota_state(
    tenant_id: str, key_id: str, session: SessionDep, principal: PrincipalDep, runtime: RuntimeDep
) -> object:
    return await quota_state(
        session, principal=principal, quotas=runtime.quotas, rejections=runtime.rejections,
        tenant_id=tenant_id, key_id=key_id, now=runtime.now(),
    )  # fmt: skip

"""/admin/v1/tenants/{tenant_id}/quotas and .../keys/{key_id}/quotas: `?model=NAME` reads or
sets the policy for one served base model's requests; without it, the all-models policy."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from gateway.admin.deps import AuditDep, PrincipalDep, RuntimeDep, SessionDep
from tenancy.crud import quotas as crud
from tenancy.errors import BadRequest
from tenancy.schemas import QuotaLimitsIn, QuotaPolicyOut

router = APIRouter(prefix="/tenants/{tenant_id}", tags=["quotas"])


def served_model(
    runtime: RuntimeDep,
    model: Annotated[
        str | None,
        Query(description="a served base model: its own policy (default: every model's)"),
    ] = None,
) -> str | None:
    served = runtime.adapters.base_models
    if model is not None and model not in served:
        names = ", ".join(repr(name[:200]) for name in served)
        raise BadRequest(
            f"model {model[:200]!r} is not served here (served: {names}).", param="model"
        )
    return model


ModelDep = Annotated[str | None, Depends(served_model)]


@router.get("/quotas", response_model=QuotaPolicyOut)
async def get_tenant_quotas(
    tenant_id: str, model: ModelDep, session: SessionDep, principal: PrincipalDep
) -> object:
    return await crud.get_policy(session, principal=principal, tenant_id=tenant_id, model=model)


@router.put("/quotas", response_model=QuotaPolicyOut)
async def put_tenant_quotas(
    tenant_id: str, body: QuotaLimitsIn, model: ModelDep, session: SessionDep, ctx: AuditDep
) -> object:
    return await crud.put_policy(session, ctx=ctx, tenant_id=tenant_id, limits=body, model=model)


@router.get("/quota-policies", response_model=list[QuotaPolicyOut])
async def list_quota_policies(
    tenant_id: str, session: SessionDep, principal: PrincipalDep
) -> object:
    """Every policy of the tenant and its keys, all-models and per model."""
    return await crud.list_policies(session, principal=principal, tenant_id=tenant_id)


@router.get("/keys/{key_id}/quotas", response_model=QuotaPolicyOut)
async def get_key_quotas(
    tenant_id: str, key_id: str, model: ModelDep, session: SessionDep, principal: PrincipalDep
) -> object:
    return await crud.get_policy(
        session, principal=principal, tenant_id=tenant_id, key_id=key_id, model=model
    )


@router.put("/keys/{key_id}/quotas", response_model=QuotaPolicyOut)
async def put_key_quotas(
    tenant_id: str,
    key_id: str,
    body: QuotaLimitsIn,
    model: ModelDep,
    session: SessionDep,
    ctx: AuditDep,
) -> object:
    return await crud.put_policy(
        session, ctx=ctx, tenant_id=tenant_id, limits=body, key_id=key_id, model=model
    )

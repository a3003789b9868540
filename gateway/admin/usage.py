"""/admin/v1/tenants/{tenant_id}/usage: per day and per model."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter

from gateway.admin.deps import PrincipalDep, SessionDep
from tenancy.crud.usage import usage_report
from tenancy.schemas import UsageRow

router = APIRouter(tags=["usage"])


@router.get("/tenants/{tenant_id}/usage", response_model=list[UsageRow])
async def get_usage(
    tenant_id: str,
    session: SessionDep,
    principal: PrincipalDep,
    since: dt.date | None = None,
    until: dt.date | None = None,
) -> object:
    return await usage_report(
        session, principal=principal, tenant_id=tenant_id, since=since, until=until
    )

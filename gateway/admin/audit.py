"""/admin/v1/audit: the audit log, filtered and scoped to the caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gateway.admin.deps import PrincipalDep, SessionDep
from tenancy.auditing.read import list_events
from tenancy.schemas import AuditEventOut, UtcDateTime

router = APIRouter(tags=["audit"])


@router.get("/audit", response_model=list[AuditEventOut])
async def get_audit(
    session: SessionDep,
    principal: PrincipalDep,
    tenant_id: str | None = None,
    action: str | None = None,
    actor: str | None = None,
    since: UtcDateTime | None = None,
    until: UtcDateTime | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> object:
    return await list_events(
        session, principal=principal, tenant_id=tenant_id, action=action, actor=actor,
        since=since, until=until, limit=limit,
    )  # fmt: skip

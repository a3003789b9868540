"""/admin/v1/audit: the audit log, filtered and scoped to the caller."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from gateway.admin.deps import PrincipalDep, SessionDep
from tenancy.auditing.actors import actor_names
from tenancy.auditing.read import list_events
from tenancy.schemas import AuditEventOut, UtcDateTime

router = APIRouter(tags=["audit"])


class AuditEventView(AuditEventOut):
    # `actor` stays the raw subject (`key:<id>`, `oidc:<issuer>#<sub>`); this is the key's name
    # for a key, else the actor as recorded.
    actor_name: str


@router.get("/audit", response_model=list[AuditEventView])
async def get_audit(
    session: SessionDep,
    principal: PrincipalDep,
    tenant_id: str | None = None,
    action: str | None = None,
    actor: str | None = None,
    since: UtcDateTime | None = None,
    until: UtcDateTime | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    events = await list_events(
        session, principal=principal, tenant_id=tenant_id, action=action, actor=actor,
        since=since, until=until, limit=limit,
    )  # fmt: skip
    names = await actor_names(session, (e.actor for e in events))
    return [
        {**AuditEventOut.model_validate(e).model_dump(), "actor_name": names[e.actor]}
        for e in events
    ]

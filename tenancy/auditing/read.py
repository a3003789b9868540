"""Reading the audit log, scoped to the caller: a tenant-admin sees only its own tenant."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auth.authz import require_any_admin
from tenancy.auth.principal import Principal
from tenancy.sql.models import AuditEvent


async def list_events(
    session: AsyncSession,
    *,
    principal: Principal,
    tenant_id: str | None = None,
    action: str | None = None,
    actor: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    limit: int = 100,
) -> list[AuditEvent]:
    require_any_admin(principal)
    e = AuditEvent
    query = select(e).order_by(e.created_at.desc(), e.id).limit(limit)
    if not principal.is_admin:
        if tenant_id is not None and tenant_id != principal.tenant_id:
            return []
        tenant_id = principal.tenant_id
    if tenant_id is not None:
        query = query.where(e.tenant_id == tenant_id)
    if action is not None:
        query = query.where(e.action == action)
    if actor is not None:
        query = query.where(e.actor == actor)
    if since is not None:
        query = query.where(e.created_at >= since)
    if until is not None:
        query = query.where(e.created_at <= until)
    return list((await session.scalars(query)).all())

"""The append-only audit log: every admin mutation records the object before and after."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auth.principal import AuditContext
from tenancy.ids import new_id
from tenancy.sql.models import AuditEvent, Base

# Columns that are secret-derived or meaningless to an auditor never enter a snapshot.
_REDACTED = {"key_hash", "secret_sealed"}


def snapshot(obj: Base | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    out: dict[str, Any] = {}
    for attr in sa_inspect(obj).mapper.column_attrs:
        if attr.key in _REDACTED:
            continue
        value = getattr(obj, attr.key)
        if isinstance(value, dt.datetime | dt.date):
            value = value.isoformat()
        out[attr.key] = value
    return out


def record_event(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    action: str,
    object_type: str,
    object_id: str,
    tenant_id: str | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> AuditEvent:
    """Adds the event to the caller's transaction, so it commits or rolls back with the change."""
    event = AuditEvent(
        id=new_id(),
        actor=ctx.principal.subject,
        actor_tenant_id=ctx.principal.tenant_id,
        tenant_id=tenant_id,
        action=action,
        object_type=object_type,
        object_id=object_id,
        before=before,
        after=after,
        request_id=ctx.request_id,
        client_addr=ctx.client_addr,
    )
    session.add(event)
    return event

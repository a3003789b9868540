"""Reads the dashboard needs beyond the admin API's: usage over time by model and adapter, when
each key was last used, requests in the last hour, and whether a session's key still holds.

All of it comes from the usage ledger (one row per settled request, tokens = prompt + completion,
what settlement charges) and the keys table. Every function is scoped by a tenant id the caller
has already checked the viewer may see (`load_tenant`), or by the principal itself.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auth.key_verify import VerifiedKey
from tenancy.auth.principal import Principal
from tenancy.auth.scopes import Scope
from tenancy.ids import ApiKeyId, TenantId
from tenancy.sql.models import Adapter, ApiKey, Tenant, UsageRecord

Bucket = Literal["hour", "day"]


@dataclass(frozen=True)
class UsagePoint:
    """Usage of one (period, model, adapter): the period starts at `start` (UTC)."""

    start: dt.datetime
    model: str
    adapter_id: str | None
    num_requests: int
    num_tokens: int  # prompt + completion


def _hour(session: AsyncSession) -> ColumnElement[str]:
    """The finished hour of a record as text `YYYY-MM-DD HH`, in the database's own dialect."""
    column = UsageRecord.finished_at
    if session.get_bind().dialect.name == "postgresql":
        return func.to_char(func.timezone("UTC", column), "YYYY-MM-DD HH24")
    return func.strftime("%Y-%m-%d %H", column)


async def usage_series(
    session: AsyncSession,
    *,
    tenant_id: str,
    since: dt.datetime,
    bucket: Bucket,
    until: dt.datetime | None = None,
) -> list[UsagePoint]:
    """Per hour (by the time a request finished) or per UTC day (the ledger's `day`, the same
    days as the admin usage report), from `since` on (and before `until`, when given)."""
    u = UsageRecord
    period: ColumnElement[object] = _hour(session) if bucket == "hour" else u.day  # type: ignore[assignment]
    query = (
        select(period, u.model, u.adapter_id, func.count(u.id),
               func.sum(u.prompt_tokens + u.completion_tokens))
        .where(u.tenant_id == tenant_id, u.finished_at >= since)
        .group_by(period, u.model, u.adapter_id)
        .order_by(period, u.model)
    )  # fmt: skip
    if until is not None:
        query = query.where(u.finished_at < until)
    points = []
    for start, model, adapter_id, count, tokens in (await session.execute(query)).all():
        if bucket == "hour":
            when = dt.datetime.strptime(str(start), "%Y-%m-%d %H").replace(tzinfo=dt.UTC)
        else:
            day = start if isinstance(start, dt.date) else dt.date.fromisoformat(str(start))
            when = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
        points.append(UsagePoint(when, model, adapter_id, int(count), int(tokens or 0)))
    return points


async def requests_since(session: AsyncSession, *, tenant_id: str, since: dt.datetime) -> int:
    query = select(func.count(UsageRecord.id)).where(
        UsageRecord.tenant_id == tenant_id, UsageRecord.finished_at >= since
    )
    return int((await session.execute(query)).scalar_one())


async def keys_last_used(session: AsyncSession, *, tenant_id: str) -> dict[str, dt.datetime]:
    """key id -> when a request made with it last finished (keys never used are absent)."""
    u = UsageRecord
    query = (
        select(u.api_key_id, func.max(u.finished_at))
        .where(u.tenant_id == tenant_id, u.api_key_id.is_not(None))
        .group_by(u.api_key_id)
    )
    out: dict[str, dt.datetime] = {}
    for key_id, when in (await session.execute(query)).all():
        if isinstance(when, str):  # SQLite returns max() of a datetime column as text
            when = dt.datetime.fromisoformat(when)
        out[str(key_id)] = when if when.tzinfo else when.replace(tzinfo=dt.UTC)
    return out


async def key_principal(
    session: AsyncSession, *, key_id: str, now: dt.datetime
) -> Principal | None:
    """The principal of a dashboard session made with an API key, if that key still holds now
    (not revoked, expired or past its rotation grace; its tenant active): a session ends with
    its key, on every replica, at the next page."""
    row = (
        await session.execute(
            select(ApiKey, Tenant)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.id == key_id)
        )
    ).first()
    if row is None:
        return None
    key, tenant = row
    record = VerifiedKey(
        key_id=ApiKeyId(key.id), tenant_id=TenantId(key.tenant_id),
        scopes=frozenset(Scope(s) for s in key.scopes), expires_at=key.expires_at,
        revoked_at=key.revoked_at, rotation_grace_until=key.rotation_grace_until,
        tenant_status=tenant.status, tenant_tier=tenant.tier, salt_epoch=tenant.salt_epoch,
    )  # fmt: skip
    if not record.is_valid(now) or record.tenant_status != "active":
        return None
    return Principal(
        subject=f"key:{key.id}",
        tenant_id=record.tenant_id,
        scopes=record.scopes,
        key_id=record.key_id,
    )


async def adapter_names(
    session: AsyncSession, *, adapter_ids: list[str]
) -> dict[str, tuple[str, str | None]]:
    """adapter id -> (name, owner tenant id or None for a public adapter)."""
    if not adapter_ids:
        return {}
    query = select(Adapter.id, Adapter.name, Adapter.owner_tenant_id).where(
        Adapter.id.in_(adapter_ids)
    )
    return {a: (name, owner) for a, name, owner in (await session.execute(query)).all()}

"""Spend read from the usage ledger: the sum of each row's `cost_micros`, which was computed at
the prices of the request's admission and written with its tokens, so a later price change never
rewrites what was spent. Per tenant, per key and per model (with its adapter), over UTC days
(`since` and `until` inclusive, by the day each request finished, as the usage report counts);
scoped like every admin read: another tenant's is a 404."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auth.authz import require_any_admin
from tenancy.auth.principal import Principal
from tenancy.crud.tenants import load_tenant
from tenancy.spend.money import from_micros
from tenancy.spend.schemas import SpendReport, SpendRow
from tenancy.sql.models import UsageRecord

u = UsageRecord
_SUMS = (
    func.count(u.id),
    func.sum(u.prompt_tokens),
    func.sum(u.cached_tokens),
    func.sum(u.completion_tokens),
    func.sum(u.cost_micros),
)


def _in_range(since: dt.date | None, until: dt.date | None) -> list[ColumnElement[bool]]:
    return [
        *([u.day >= since] if since is not None else []),
        *([u.day <= until] if until is not None else []),
    ]


def _row(sums: tuple[Any, ...], **group: str | None) -> SpendRow:
    n, prompt, cached, completion, micros = sums
    cost = int(micros or 0)
    return SpendRow(
        **group,
        num_requests=int(n or 0),
        prompt_tokens=int(prompt or 0),
        cached_tokens=int(cached or 0),
        completion_tokens=int(completion or 0),
        cost_micros=cost,
        cost=from_micros(cost),
    )


async def spend_report(
    session: AsyncSession,
    *,
    principal: Principal,
    tenant_id: str,
    currency: str,
    since: dt.date | None = None,
    until: dt.date | None = None,
) -> SpendReport:
    """The tenant's total, then per key and per model (dearest first)."""
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    where = [u.tenant_id == tenant_id, *_in_range(since, until)]
    total = (await session.execute(select(*_SUMS).where(*where))).one()
    by_key = select(u.api_key_id, *_SUMS).where(*where).group_by(u.api_key_id)
    by_model = select(u.model, u.adapter_id, *_SUMS).where(*where).group_by(u.model, u.adapter_id)
    keys = [_row(tuple(r[1:]), api_key_id=r[0]) for r in (await session.execute(by_key)).all()]
    models = [
        _row(tuple(r[2:]), model=r[0], adapter_id=r[1])
        for r in (await session.execute(by_model)).all()
    ]
    return SpendReport(
        tenant_id=tenant_id,
        currency=currency,
        since=since,
        until=until,
        total=_row(tuple(total), tenant_id=tenant_id),
        by_key=sorted(keys, key=lambda r: (-r.cost_micros, r.api_key_id or "")),
        by_model=sorted(models, key=lambda r: (-r.cost_micros, r.model or "", r.adapter_id or "")),
    )


async def spend_by_tenant(
    session: AsyncSession,
    *,
    principal: Principal,
    since: dt.date | None = None,
    until: dt.date | None = None,
) -> list[SpendRow]:
    """Every tenant's total for an admin; a tenant-admin's own tenant only (dearest first)."""
    require_any_admin(principal)
    query = select(u.tenant_id, *_SUMS).where(*_in_range(since, until)).group_by(u.tenant_id)
    if not principal.is_admin:
        query = query.where(u.tenant_id == (principal.tenant_id or ""))
    rows = [_row(tuple(r[1:]), tenant_id=r[0]) for r in (await session.execute(query)).all()]
    return sorted(rows, key=lambda r: (-r.cost_micros, r.tenant_id or ""))

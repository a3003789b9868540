"""The usage ledger: one row per request (idempotent by request id), reports per day and model."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import cast

from sqlalchemy import Table, case, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auth.principal import Principal
from tenancy.crud.tenants import load_tenant
from tenancy.crud.usage_copy import can_copy, copy_records
from tenancy.ids import ApiKeyId, RequestId, TenantId, new_id
from tenancy.schemas import UsageRow
from tenancy.sql.models import Adapter, UsageRecord


@dataclass(frozen=True)
class UsageIn:
    request_id: RequestId
    tenant_id: TenantId
    api_key_id: ApiKeyId | None
    model: str
    adapter_id: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str
    started_at: dt.datetime
    finished_at: dt.datetime
    # At the prices of its admission (tenancy/spend/money.py); 0 where nothing is priced.
    cost_micros: int = 0
    adapter_version: int | None = None  # the version of adapter_id's name that served it


async def record_usage(session: AsyncSession, *, record: UsageIn) -> bool:
    """False when this request id is already in the ledger (a retried settlement)."""
    session.add(
        UsageRecord(
            id=new_id(),
            day=record.finished_at.astimezone(dt.UTC).date(),
            **asdict(record),
        )
    )
    try:
        await session.commit()
    except IntegrityError:
        await session.rollback()
        return False
    return True


async def record_usage_batch(session: AsyncSession, *, records: list[UsageIn]) -> int:
    """Write many records in one transaction; on a duplicate request id, fall back to one by
    one (so a retried settlement never drops the others). Returns how many were new."""
    try:
        if can_copy(session):  # PostgreSQL: one binary COPY (tenancy/crud/usage_copy.py)
            await copy_records(session, records)
        else:  # a Core executemany INSERT, not the unit of work: the ledger is write-heavy
            # Shallow (vars, not asdict): asdict deep-copies every datetime, per record.
            rows = [
                {"id": new_id(), "day": r.finished_at.astimezone(dt.UTC).date(), **vars(r)}
                for r in records
            ]
            await session.execute(insert(cast(Table, UsageRecord.__table__)), rows)
        await session.commit()
    except IntegrityError:
        await session.rollback()
        written = 0
        for record in records:
            written += await record_usage(session, record=record)
        return written
    return len(records)


@dataclass(frozen=True)
class Spent:
    """Tokens and micro-units charged to one (tenant, key) on one base model since the start of
    the UTC day and month."""

    tenant_id: TenantId
    api_key_id: ApiKeyId | None
    day_tokens: int
    month_tokens: int
    day_micros: int = 0
    month_micros: int = 0
    # The base model as recorded: an adapter's row's, else the request's model (a base model's
    # own name); None for an adapter whose row is gone (the ledger outlives adapters).
    base_model: str | None = None
    is_adapter: bool = False


async def spent_to_date(session: AsyncSession, *, now: dt.datetime) -> list[Spent]:
    """What the ledger charged this UTC month and day, per tenant, key and base model: what a
    quota store that lost its counters (an in-process one, restarted) must count again.

    A record belongs to the period of its start (admission time), as the quota stores charge
    it; its charge is prompt plus completion tokens, as settlement counts it, and its cost.
    """
    u = UsageRecord
    day_start = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    month_start = day_start.replace(day=1)
    tokens = u.prompt_tokens + u.completion_tokens
    is_adapter = u.adapter_id.is_not(None)
    base = case((is_adapter, Adapter.base_model), else_=u.model)
    query = (
        select(
            u.tenant_id,
            u.api_key_id,
            base,
            is_adapter,
            func.sum(tokens),
            func.sum(case((u.started_at >= day_start, tokens), else_=0)),
            func.sum(u.cost_micros),
            func.sum(case((u.started_at >= day_start, u.cost_micros), else_=0)),
        )
        .outerjoin(Adapter, Adapter.id == u.adapter_id)
        .where(u.started_at >= month_start)
        .group_by(u.tenant_id, u.api_key_id, base, is_adapter)
    )
    return [
        Spent(
            tenant_id=TenantId(tenant),
            api_key_id=ApiKeyId(key) if key is not None else None,
            day_tokens=int(day or 0),
            month_tokens=int(month or 0),
            day_micros=int(day_micros or 0),
            month_micros=int(month_micros or 0),
            base_model=model,
            is_adapter=bool(adapter),
        )
        for tenant, key, model, adapter, month, day, month_micros, day_micros in (
            await session.execute(query)
        ).all()
    ]


async def usage_report(
    session: AsyncSession,
    *,
    principal: Principal,
    tenant_id: str,
    since: dt.date | None = None,
    until: dt.date | None = None,
) -> list[UsageRow]:
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    u = UsageRecord
    query = (
        select(
            u.day,
            u.model,
            func.count(u.id),
            func.sum(u.prompt_tokens),
            func.sum(u.completion_tokens),
            func.sum(u.cached_tokens),
        )
        .where(u.tenant_id == tenant_id)
        .group_by(u.day, u.model)
        .order_by(u.day, u.model)
    )
    if since is not None:
        query = query.where(u.day >= since)
    if until is not None:
        query = query.where(u.day <= until)
    return [
        UsageRow(
            tenant_id=tenant_id,
            day=day,
            model=model,
            num_requests=n,
            prompt_tokens=p or 0,
            completion_tokens=c or 0,
            cached_tokens=k or 0,
        )
        for day, model, n, p, c, k in (await session.execute(query)).all()
    ]

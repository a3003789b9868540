"""A tenant's usage over a time range, summed per key or per model (and adapter): the dashboard's
usage page. Read from the usage ledger (one row per settled request) by the time a request
finished, the same clock as the dashboard's charts; scoped like every admin read (`load_tenant`:
another tenant's is a 404)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auth.principal import Principal
from tenancy.crud.tenants import load_tenant
from tenancy.sql.models import UsageRecord

GroupBy = Literal["key", "model"]


@dataclass(frozen=True)
class UsageTotal:
    """One key's (`key_id`; None for requests made without one) or one model's usage."""

    key_id: str | None
    model: str | None
    adapter_id: str | None
    num_requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def num_tokens(self) -> int:  # what settlement charges
        return self.prompt_tokens + self.completion_tokens


async def usage_totals(
    session: AsyncSession,
    *,
    principal: Principal,
    tenant_id: str,
    since: dt.datetime,
    until: dt.datetime,
    by: GroupBy,
) -> list[UsageTotal]:
    """Requests that finished in [since, until), most tokens first."""
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    u = UsageRecord
    groups = (u.api_key_id,) if by == "key" else (u.model, u.adapter_id)
    tokens = func.sum(u.prompt_tokens + u.completion_tokens)
    query = (
        select(*groups, func.count(u.id), func.sum(u.prompt_tokens),
               func.sum(u.completion_tokens), func.sum(u.cached_tokens))
        .where(u.tenant_id == tenant_id, u.finished_at >= since, u.finished_at < until)
        .group_by(*groups)
        .order_by(tokens.desc(), *groups)
    )  # fmt: skip
    out = []
    for row in (await session.execute(query)).all():
        *group, n, prompt, completion, cached = row
        key_id, model, adapter_id = (group[0], None, None) if by == "key" else (None, *group)
        out.append(
            UsageTotal(
                key_id=key_id, model=model, adapter_id=adapter_id, num_requests=int(n),
                prompt_tokens=int(prompt or 0), completion_tokens=int(completion or 0),
                cached_tokens=int(cached or 0),
            )
        )  # fmt: skip
    return out

"""A subject's live quota state, read from the store that admits requests.

For each limit of a tenant's (or a key's) policy: the limit, what is in use, what remains and
when it resets, exactly as the quota store counts them (`QuotaStore.usage`, in-process or
Redis), so the admin API, the CLI and the dashboard show the numbers admission enforces:

| limit | in use | resets |
|---|---|---|
| requests_per_minute | requests admitted in the sliding 60 s window | when the oldest leaves the window |
| tokens_per_minute | their tokens (reserved, or settled) | the same |
| max_concurrent | leases held by requests in flight | none: a slot frees when a request ends |
| daily_token_budget | tokens charged this UTC day | the next UTC midnight |
| monthly_token_budget | tokens charged this UTC month | the first of the next UTC month |
| daily_spend_budget_micros | micro-units of the currency charged this UTC day | the next UTC midnight |
| monthly_spend_budget_micros | micro-units charged this UTC month | the first of the next UTC month |

A key without a policy of its own has no counters (admission checks only the tenant for it):
its state says so (`has_own_policy` false) and every limit is null.
"""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auth.principal import Principal
from tenancy.crud.keys import load_key
from tenancy.crud.quotas import subjects_for
from tenancy.crud.tenants import load_tenant
from tenancy.quota.rejections import RejectionLog
from tenancy.quota.store import Limit, QuotaLimits, QuotaStore, QuotaUsage, periods
from tenancy.quota.subjects import key_subject, tenant_subject

READING_ORDER = (
    Limit.RPM, Limit.TPM, Limit.CONCURRENCY, Limit.DAILY, Limit.MONTHLY,
    Limit.DAILY_SPEND, Limit.MONTHLY_SPEND,
)  # fmt: skip


class LimitState(BaseModel):
    name: Limit
    limit: int | None = Field(description="null: unlimited")
    used: int
    remaining: int | None = Field(description="limit - used, never below 0; null: unlimited")
    resets_in_s: float | None = Field(description="null: frees as requests finish, or unused")
    resets_at: dt.datetime | None


class QuotaStateOut(BaseModel):
    tenant_id: str
    api_key_id: str | None
    subject: str = Field(description='the quota store\'s subject: "t:<tenant id>" or "k:<key id>"')
    has_own_policy: bool
    as_of: dt.datetime
    limits: list[LimitState]
    rejections_last_hour: dict[str, int] = Field(description="error code -> count")


def _used(limit: Limit, usage: QuotaUsage) -> int:
    return {
        Limit.RPM: usage.num_requests,
        Limit.TPM: usage.num_tokens,
        Limit.CONCURRENCY: usage.num_leases,
        Limit.DAILY: usage.day_tokens,
        Limit.MONTHLY: usage.month_tokens,
        Limit.DAILY_SPEND: usage.day_spend_micros,
        Limit.MONTHLY_SPEND: usage.month_spend_micros,
    }[limit]


def limit_states(limits: QuotaLimits, usage: QuotaUsage, now: dt.datetime) -> list[LimitState]:
    """Rows in a person's reading order: the minute windows, concurrency, then the budgets."""
    _, _, to_day_end, to_month_end = periods(now.timestamp())
    resets: dict[Limit, float | None] = {
        Limit.RPM: usage.window_reset_s if usage.num_requests else None,
        Limit.TPM: usage.window_reset_s if usage.num_requests else None,
        Limit.CONCURRENCY: None,
        Limit.DAILY: to_day_end,
        Limit.MONTHLY: to_month_end,
        Limit.DAILY_SPEND: to_day_end,
        Limit.MONTHLY_SPEND: to_month_end,
    }
    rows = []
    for limit in READING_ORDER:
        cap, used, reset = limits.get(limit), _used(limit, usage), resets[limit]
        rows.append(
            LimitState(
                name=limit,
                limit=cap,
                used=used,
                remaining=None if cap is None else max(0, cap - used),
                resets_in_s=reset,
                resets_at=None if reset is None else now + dt.timedelta(seconds=reset),
            )
        )
    return rows


async def quota_state(
    session: AsyncSession,
    *,
    principal: Principal,
    quotas: QuotaStore,
    rejections: RejectionLog,
    tenant_id: str,
    key_id: str | None = None,
    now: dt.datetime,
) -> QuotaStateOut:
    """The tenant's state, or one key's (scoped: another tenant is a 404, as everywhere)."""
    if key_id is None:
        await load_tenant(session, principal=principal, tenant_id=tenant_id)
    else:
        await load_key(session, principal=principal, tenant_id=tenant_id, key_id=key_id)
    subjects = await subjects_for(session, tenant_id=tenant_id, key_id=key_id)
    subject_key = tenant_subject(tenant_id) if key_id is None else key_subject(key_id)
    own = next((s for s in subjects if s.key == subject_key), None)
    usage = await quotas.usage(subject_key)
    return QuotaStateOut(
        tenant_id=tenant_id,
        api_key_id=key_id,
        subject=subject_key,
        has_own_policy=own is not None and own.limits != QuotaLimits(),
        as_of=now,
        limits=limit_states(own.limits if own else QuotaLimits(), usage, now),
        rejections_last_hour=await rejections.last_hour(subject_key),
    )

"""What each dashboard page shows, gathered for one viewer (a `Principal`).

Every number comes from where it is enforced or recorded: limits and their use from the quota
store (`tenancy/quota/state.py`, the admin API's quota-state), tokens and requests over time from
the usage ledger, keys and adapters from the tenancy tables through the admin API's scoped CRUD
functions. A tenant the viewer may not see raises the same NotFound the admin API raises.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from gateway.dashboard.charts import UsageChart, usage_chart
from gateway.engines.status import ReplicaStatus, engine_status
from gateway.state import GatewayState
from gateway.telemetry.metrics import tenant_series_label
from tenancy.auditing.actors import actor_names
from tenancy.auditing.read import list_events
from tenancy.auth.principal import Principal
from tenancy.crud.adapters import list_adapters
from tenancy.crud.keys import list_keys
from tenancy.crud.tenants import list_tenants, load_tenant
from tenancy.dashboard_reads import adapter_names, keys_last_used, requests_since, usage_series
from tenancy.quota.state import QuotaStateOut, quota_state
from tenancy.runtime import TenancyRuntime
from tenancy.spend.report import spend_report
from tenancy.spend.schemas import SpendReport
from tenancy.sql.models import Adapter, ApiKey, AuditEvent, Tenant

HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
NUM_HOURS = 48
NUM_DAYS = 60
NUM_AUDIT_EVENTS = 20


@dataclass(frozen=True)
class TenantSummary:
    tenant: Tenant
    state: QuotaStateOut
    num_requests_hour: int
    num_rejections_hour: int
    adapters: list[Adapter]  # its own (public ones are on every tenant's page)

    def used(self, name: str) -> int:
        return next(row.used for row in self.state.limits if row.name == name)


@dataclass(frozen=True)
class KeyRow:
    id: str
    name: str
    masked: str  # prefix and last four only
    scopes: list[str]
    status: str  # active, expired, revoked, rotated
    expires_at: dt.datetime | None
    last_used_at: dt.datetime | None


@dataclass(frozen=True)
class AuditRow:
    event: AuditEvent
    actor_name: str  # the key's name for `key:<id>`; the raw actor stays on `event`


@dataclass(frozen=True)
class TenantPage:
    summary: TenantSummary
    metrics_label: str  # its `tenant` label on /metrics, to find its Grafana series
    keys: list[KeyRow]
    adapters: list[Adapter]  # own and public
    audit: list[AuditRow]
    hourly: UsageChart
    daily: UsageChart
    spend: SpendReport  # this UTC month, from the usage ledger's costs


@dataclass(frozen=True)
class EngineRow:
    status: ReplicaStatus
    # tier -> adapter names the viewer may see; adapters of other tenants are only counted
    adapters: dict[str, list[str]]
    num_hidden: dict[str, int]

    @property
    def tier_labels(self) -> dict[str, str]:
        """The tiers' names on the wire are fixed ("gpu" is vLLM's word for an adapter slot); on
        the page a slot is named by the device it is on, so a CPU engine's do not read "gpu"."""
        device = self.status.device
        return {
            "gpu": f"{device} slot" if device else "device slot",
            "cpu": "memory",
            "disk": "disk",
        }


async def _summary(
    session: AsyncSession, runtime: TenancyRuntime, principal: Principal, tenant: Tenant,
    now: dt.datetime,
) -> TenantSummary:  # fmt: skip
    state = await quota_state(
        session, principal=principal, quotas=runtime.quotas, rejections=runtime.rejections,
        tenant_id=tenant.id, now=now,
    )  # fmt: skip
    adapters = await list_adapters(session, principal=principal, tenant_id=tenant.id)
    return TenantSummary(
        tenant=tenant,
        state=state,
        num_requests_hour=await requests_since(session, tenant_id=tenant.id, since=now - HOUR),
        num_rejections_hour=sum(state.rejections_last_hour.values()),
        adapters=[a for a in adapters if a.owner_tenant_id == tenant.id],
    )


async def overview(
    runtime: TenancyRuntime, principal: Principal, now: dt.datetime
) -> list[TenantSummary]:
    async with runtime.sessionmaker() as session:
        tenants = await list_tenants(session, principal=principal)
        return [await _summary(session, runtime, principal, t, now) for t in tenants]


def _key_status(key: ApiKey, now: dt.datetime) -> str:
    if key.revoked_at is not None:
        return "revoked"
    if key.rotation_grace_until is not None:
        return "rotated" if now < key.rotation_grace_until else "replaced"
    return "expired" if key.expires_at is not None and now >= key.expires_at else "active"


def _floor(now: dt.datetime, step: dt.timedelta) -> dt.datetime:
    if step == DAY:
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    return now.replace(minute=0, second=0, microsecond=0)


async def key_rows(
    session: AsyncSession, principal: Principal, tenant_id: str, now: dt.datetime
) -> list[KeyRow]:
    """The tenant's keys, masked, with their status and last use (the tenant and keys pages)."""
    last_used = await keys_last_used(session, tenant_id=tenant_id)
    return [
        KeyRow(
            id=k.id, name=k.name, masked=f"{k.prefix}…{k.last_four}", scopes=list(k.scopes),
            status=_key_status(k, now), expires_at=k.expires_at,
            last_used_at=last_used.get(k.id),
        )
        for k in await list_keys(session, principal=principal, tenant_id=tenant_id)
    ]  # fmt: skip


async def tenant_page(
    runtime: TenancyRuntime, principal: Principal, tenant_id: str, now: dt.datetime
) -> TenantPage:
    async with runtime.sessionmaker() as session:
        tenant = await load_tenant(session, principal=principal, tenant_id=tenant_id)
        summary = await _summary(session, runtime, principal, tenant, now)
        keys = await key_rows(session, principal, tenant_id, now)
        adapters = await list_adapters(session, principal=principal, tenant_id=tenant_id)
        events = await list_events(
            session, principal=principal, tenant_id=tenant_id, limit=NUM_AUDIT_EVENTS
        )
        names = await actor_names(session, (e.actor for e in events))
        audit = [AuditRow(event=e, actor_name=names[e.actor]) for e in events]
        hour0 = _floor(now, HOUR) - (NUM_HOURS - 1) * HOUR
        day0 = _floor(now, DAY) - (NUM_DAYS - 1) * DAY
        hourly = await usage_series(session, tenant_id=tenant_id, since=hour0, bucket="hour")
        daily = await usage_series(session, tenant_id=tenant_id, since=day0, bucket="day")
        spend = await spend_report(
            session, principal=principal, tenant_id=tenant_id,
            currency=runtime.settings.currency, since=now.astimezone(dt.UTC).date().replace(day=1),
        )  # fmt: skip
    return TenantPage(
        summary=summary,
        metrics_label=tenant_series_label(tenant_id),
        keys=keys,
        adapters=adapters,
        audit=audit,
        hourly=usage_chart(
            hourly, title=f"Tokens per hour, last {NUM_HOURS} hours (UTC)", start=hour0,
            step=HOUR, num_buckets=NUM_HOURS, label_every=6, label_format="%d %H:00",
        ),
        daily=usage_chart(
            daily, title=f"Tokens per day, last {NUM_DAYS} days (UTC)", start=day0, step=DAY,
            num_buckets=NUM_DAYS, label_every=10, label_format="%b %d",
        ),
        spend=spend,
    )  # fmt: skip


async def engines_page(state: GatewayState, principal: Principal) -> list[EngineRow]:
    pools = state.engines()
    answers = await asyncio.gather(*(engine_status(engine) for engine in pools.values()))
    replicas = list(answers[0])  # the primary's under their own names, as with one model
    for model, statuses in zip(list(pools)[1:], answers[1:], strict=True):
        for status in statuses:
            status.name = f"{model}/{status.name}"
            replicas.append(status)
    ids = sorted(
        {name for r in replicas for names in r.adapters_by_tier.values() for name in names}
    )
    async with state.tenancy.sessionmaker() as session:
        known = await adapter_names(session, adapter_ids=ids)
    rows = []
    for replica in replicas:
        shown: dict[str, list[str]] = {}
        hidden: dict[str, int] = {}
        for tier, names in replica.adapters_by_tier.items():
            for engine_name in names:
                name, owner = known.get(engine_name, (engine_name, ""))
                if owner is None or principal.can_see_tenant(owner):
                    shown.setdefault(tier, []).append(name)
                else:
                    hidden[tier] = hidden.get(tier, 0) + 1
        rows.append(EngineRow(status=replica, adapters=shown, num_hidden=hidden))
    return rows

"""Quota policies: per tenant (admin sets) and per key (tenant-admin may set, never above the
tenant's own limits). Also the subjects an admission checks."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auditing.write import record_event, snapshot
from tenancy.auth.authz import require_admin
from tenancy.auth.principal import AuditContext, Principal
from tenancy.crud.keys import load_key
from tenancy.crud.tenants import load_tenant
from tenancy.errors import InsufficientScope
from tenancy.ids import new_id
from tenancy.quota.store import QuotaLimits, QuotaSubject
from tenancy.schemas import QuotaLimitsIn, QuotaPolicyOut
from tenancy.sql.models import QuotaPolicy, utcnow

_FIELDS = tuple(QuotaLimitsIn.model_fields)


async def _find(session: AsyncSession, tenant_id: str, key_id: str | None) -> QuotaPolicy | None:
    query = select(QuotaPolicy).where(QuotaPolicy.tenant_id == tenant_id)
    query = query.where(
        QuotaPolicy.api_key_id.is_(None) if key_id is None else QuotaPolicy.api_key_id == key_id
    )
    return (await session.scalars(query)).first()


def _out(tenant_id: str, key_id: str | None, policy: QuotaPolicy | None) -> QuotaPolicyOut:
    values = {f: getattr(policy, f) for f in _FIELDS} if policy else {}
    return QuotaPolicyOut(tenant_id=tenant_id, api_key_id=key_id, **values)


async def get_policy(
    session: AsyncSession, *, principal: Principal, tenant_id: str, key_id: str | None = None
) -> QuotaPolicyOut:
    if key_id is None:
        await load_tenant(session, principal=principal, tenant_id=tenant_id)
    else:
        await load_key(session, principal=principal, tenant_id=tenant_id, key_id=key_id)
    return _out(tenant_id, key_id, await _find(session, tenant_id, key_id))


def _check_not_wider(limits: QuotaLimitsIn, ceiling: QuotaPolicy | None) -> None:
    for name in _FIELDS:
        cap = getattr(ceiling, name) if ceiling else None
        value = getattr(limits, name)
        if cap is not None and (value is None or value > cap):
            raise InsufficientScope(f"A key's {name} cannot exceed its tenant's.")


async def put_policy(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    tenant_id: str,
    limits: QuotaLimitsIn,
    key_id: str | None = None,
) -> QuotaPolicyOut:
    if key_id is None:
        await load_tenant(session, principal=ctx.principal, tenant_id=tenant_id)
        require_admin(ctx.principal)
    else:
        await load_key(session, principal=ctx.principal, tenant_id=tenant_id, key_id=key_id)
        if not ctx.principal.is_admin:
            _check_not_wider(limits, await _find(session, tenant_id, None))
    policy = await _find(session, tenant_id, key_id)
    before = snapshot(policy)
    if policy is None:
        policy = QuotaPolicy(id=new_id(), tenant_id=tenant_id, api_key_id=key_id)
        session.add(policy)
    for name in _FIELDS:
        setattr(policy, name, getattr(limits, name))
    policy.updated_at = utcnow()
    await session.flush()
    record_event(
        session, ctx=ctx, action="quota.put", object_type="quota_policy", object_id=policy.id,
        tenant_id=tenant_id, before=before, after=snapshot(policy),
    )  # fmt: skip
    await session.commit()
    return _out(tenant_id, key_id, policy)


def _limits(policy: QuotaPolicy) -> QuotaLimits:
    return QuotaLimits(**{f: getattr(policy, f) for f in _FIELDS})


async def subjects_for(
    session: AsyncSession, *, tenant_id: str, key_id: str | None
) -> list[QuotaSubject]:
    """The tenant's subject, plus the key's when the key has its own policy."""
    subjects = [QuotaSubject(f"t:{tenant_id}", QuotaLimits())]
    tenant_policy = await _find(session, tenant_id, None)
    if tenant_policy is not None:
        subjects[0] = QuotaSubject(f"t:{tenant_id}", _limits(tenant_policy))
    if key_id is not None:
        key_policy = await _find(session, tenant_id, key_id)
        if key_policy is not None:
            subjects.append(QuotaSubject(f"k:{key_id}", _limits(key_policy)))
    return subjects

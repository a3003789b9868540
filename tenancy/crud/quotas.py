"""Quota policies: per tenant (admin sets) and per key (tenant-admin may set, never above the
tenant's own limits); each for every model (`model` None) or for one served base model. Also
the subjects an admission checks.

A request on base model M (or an adapter of M) is held to every policy that names it: the
tenant's and its key's all-models policies, and the tenant's and its key's policies for M. A
tenant-admin's key policy for M may not exceed, field by field, the lower of the tenant's policy
for M and the tenant's all-models policy: both bind the key's requests on M already, so a wider
key policy would only read as a promise the gateway does not keep.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auditing.write import record_event, snapshot
from tenancy.auth.authz import require_admin
from tenancy.auth.principal import AuditContext, Principal
from tenancy.crud.keys import load_key
from tenancy.crud.tenants import load_tenant
from tenancy.errors import InsufficientScope
from tenancy.ids import new_id
from tenancy.quota.store import QuotaLimits, QuotaSubject
from tenancy.quota.subjects import key_subject, tenant_subject
from tenancy.schemas import QuotaLimitsIn, QuotaPolicyOut
from tenancy.sql.models import QuotaPolicy, utcnow

_FIELDS = tuple(QuotaLimitsIn.model_fields)


async def _find(
    session: AsyncSession, tenant_id: str, key_id: str | None, model: str | None
) -> QuotaPolicy | None:
    query = select(QuotaPolicy).where(QuotaPolicy.tenant_id == tenant_id)
    query = query.where(
        QuotaPolicy.api_key_id.is_(None) if key_id is None else QuotaPolicy.api_key_id == key_id
    )
    query = query.where(
        QuotaPolicy.model.is_(None) if model is None else QuotaPolicy.model == model
    )
    return (await session.scalars(query)).first()


def _out(
    tenant_id: str, key_id: str | None, model: str | None, policy: QuotaPolicy | None
) -> QuotaPolicyOut:
    values = {f: getattr(policy, f) for f in _FIELDS} if policy else {}
    return QuotaPolicyOut(tenant_id=tenant_id, api_key_id=key_id, model=model, **values)


async def get_policy(
    session: AsyncSession,
    *,
    principal: Principal,
    tenant_id: str,
    key_id: str | None = None,
    model: str | None = None,
) -> QuotaPolicyOut:
    """`model`: a served base model's policy (the caller checks it is served); None: every
    model's. No policy reads as every limit unlimited."""
    if key_id is None:
        await load_tenant(session, principal=principal, tenant_id=tenant_id)
    else:
        await load_key(session, principal=principal, tenant_id=tenant_id, key_id=key_id)
    return _out(tenant_id, key_id, model, await _find(session, tenant_id, key_id, model))


def _check_not_wider(limits: QuotaLimitsIn, ceilings: Sequence[QuotaPolicy | None]) -> None:
    for name in _FIELDS:
        caps = [getattr(c, name) for c in ceilings if c is not None]
        cap = min((c for c in caps if c is not None), default=None)
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
    model: str | None = None,
) -> QuotaPolicyOut:
    """`model` as in get_policy; the audit entry (quota.put) records it with the limits."""
    if key_id is None:
        await load_tenant(session, principal=ctx.principal, tenant_id=tenant_id)
        require_admin(ctx.principal)
    else:
        await load_key(session, principal=ctx.principal, tenant_id=tenant_id, key_id=key_id)
        if not ctx.principal.is_admin:
            ceilings = [await _find(session, tenant_id, None, None)]
            if model is not None:
                ceilings.append(await _find(session, tenant_id, None, model))
            _check_not_wider(limits, ceilings)
    policy = await _find(session, tenant_id, key_id, model)
    before = snapshot(policy)
    if policy is None:
        policy = QuotaPolicy(id=new_id(), tenant_id=tenant_id, api_key_id=key_id, model=model)
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
    return _out(tenant_id, key_id, model, policy)


async def list_policies(
    session: AsyncSession, *, principal: Principal, tenant_id: str
) -> list[QuotaPolicyOut]:
    """Every policy the tenant and its keys have, any model: the tenant's first, all-models
    before a model's."""
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    rows = (
        await session.scalars(select(QuotaPolicy).where(QuotaPolicy.tenant_id == tenant_id))
    ).all()
    rows = sorted(rows, key=lambda p: (p.api_key_id or "", p.model or ""))
    return [_out(tenant_id, p.api_key_id, p.model, p) for p in rows]


def _limits(policy: QuotaPolicy) -> QuotaLimits:
    return QuotaLimits(**{f: getattr(policy, f) for f in _FIELDS})


async def subjects_for(
    session: AsyncSession, *, tenant_id: str, key_id: str | None, model: str | None = None
) -> list[QuotaSubject]:
    """The tenant's subject (always, and first: the Redis store's group), the key's when it has
    its own policy, then, for a request on base model `model`, one per policy naming that model
    (the tenant's, then the key's). One query."""
    owner: ColumnElement[bool] = QuotaPolicy.api_key_id.is_(None)
    if key_id is not None:
        owner = or_(owner, QuotaPolicy.api_key_id == key_id)
    for_model: ColumnElement[bool] = QuotaPolicy.model.is_(None)
    if model is not None:
        for_model = or_(for_model, QuotaPolicy.model == model)
    query = select(QuotaPolicy).where(QuotaPolicy.tenant_id == tenant_id, owner, for_model)
    found = {(p.api_key_id, p.model): p for p in (await session.scalars(query)).all()}
    tenant_policy = found.get((None, None))
    subjects = [
        QuotaSubject(
            tenant_subject(tenant_id),
            _limits(tenant_policy) if tenant_policy is not None else QuotaLimits(),
        )
    ]
    named: list[tuple[QuotaPolicy | None, str]] = []
    if key_id is not None:
        named.append((found.get((key_id, None)), key_subject(key_id)))
    if model is not None:
        named.append((found.get((None, model)), tenant_subject(tenant_id, model)))
        if key_id is not None:
            named.append((found.get((key_id, model)), key_subject(key_id, model)))
    subjects += [QuotaSubject(key, _limits(policy)) for policy, key in named if policy is not None]
    return subjects

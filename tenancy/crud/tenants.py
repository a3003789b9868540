"""Tenants: create, list, get, update, delete, rotate the cache-salt epoch."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.adapters.service import AdapterService
from tenancy.auditing.write import record_event, snapshot
from tenancy.auth.authz import require_admin, require_any_admin, require_tenant_visible
from tenancy.auth.principal import AuditContext, Principal
from tenancy.errors import BadRequest, Conflict, NotFound
from tenancy.ids import new_id
from tenancy.schemas import TenantCreate, TenantUpdate
from tenancy.sql.models import Adapter, Tenant, utcnow


async def load_tenant(session: AsyncSession, *, principal: Principal, tenant_id: str) -> Tenant:
    require_any_admin(principal)
    require_tenant_visible(principal, tenant_id)
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None or tenant.status == "deleted":
        raise NotFound("Tenant")
    return tenant


def _check_tier(tier: str, tiers: frozenset[str]) -> None:
    if tier not in tiers:
        raise BadRequest(f"Unknown tier; expected one of {sorted(tiers)}.", param="tier")


async def create_tenant(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    data: TenantCreate,
    tiers: frozenset[str],
    default_tier: str,
) -> Tenant:
    require_admin(ctx.principal)
    tier = data.tier or default_tier
    _check_tier(tier, tiers)
    tenant = Tenant(id=new_id(), name=data.name, tier=tier, status="active", salt_epoch=0)
    session.add(tenant)
    try:
        await session.flush()
    except IntegrityError as exc:
        await session.rollback()
        raise Conflict("A tenant with this name exists.", param="name") from exc
    record_event(
        session, ctx=ctx, action="tenant.create", object_type="tenant", object_id=tenant.id,
        tenant_id=tenant.id, before=None, after=snapshot(tenant),
    )  # fmt: skip
    await session.commit()
    return tenant


async def list_tenants(session: AsyncSession, *, principal: Principal) -> list[Tenant]:
    require_any_admin(principal)
    query = select(Tenant).where(Tenant.status != "deleted").order_by(Tenant.created_at)
    if not principal.is_admin:
        query = query.where(Tenant.id == principal.tenant_id)
    return list((await session.scalars(query)).all())


async def update_tenant(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    tenant_id: str,
    data: TenantUpdate,
    tiers: frozenset[str],
) -> Tenant:
    tenant = await load_tenant(session, principal=ctx.principal, tenant_id=tenant_id)
    require_admin(ctx.principal)
    before = snapshot(tenant)
    if data.tier is not None:
        _check_tier(data.tier, tiers)
        tenant.tier = data.tier
    if data.name is not None:
        tenant.name = data.name
    if data.status is not None:
        tenant.status = data.status
    tenant.updated_at = utcnow()
    try:
        await session.flush()
    except IntegrityError as exc:
        await session.rollback()
        raise Conflict("A tenant with this name exists.", param="name") from exc
    record_event(
        session, ctx=ctx, action="tenant.update", object_type="tenant", object_id=tenant.id,
        tenant_id=tenant.id, before=before, after=snapshot(tenant),
    )  # fmt: skip
    await session.commit()
    return tenant


async def delete_tenant(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    tenant_id: str,
    service: AdapterService | None = None,
) -> list[str]:
    """Hard delete: keys, quotas and adapters cascade; the usage ledger and audit log remain.

    The tenant's adapter files are removed with its rows (through `service`; every caller that
    deletes for real passes it). Returns the ids of the adapters that went with it, the names
    engines hold them under, so the caller can unload them there."""
    tenant = await load_tenant(session, principal=ctx.principal, tenant_id=tenant_id)
    require_admin(ctx.principal)
    before = snapshot(tenant)
    owned = await session.scalars(select(Adapter.id).where(Adapter.owner_tenant_id == tenant_id))
    adapter_ids = list(owned.all())
    await session.delete(tenant)
    record_event(
        session, ctx=ctx, action="tenant.delete", object_type="tenant", object_id=tenant_id,
        tenant_id=tenant_id, before=before, after=None,
    )  # fmt: skip
    await session.commit()
    if service is not None:
        service.remove_owner(tenant_id)
        await service.collect_garbage(session)  # blobs only its versions named
    return adapter_ids


async def rotate_salt(session: AsyncSession, *, ctx: AuditContext, tenant_id: str) -> Tenant:
    tenant = await load_tenant(session, principal=ctx.principal, tenant_id=tenant_id)
    require_admin(ctx.principal)
    before = snapshot(tenant)
    tenant.salt_epoch += 1
    tenant.updated_at = utcnow()
    record_event(
        session, ctx=ctx, action="tenant.rotate_salt", object_type="tenant", object_id=tenant.id,
        tenant_id=tenant.id, before=before, after=snapshot(tenant),
    )  # fmt: skip
    await session.commit()
    return tenant

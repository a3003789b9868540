"""Adapters: register (validated, stored, then recorded), list visible, get, delete.

A tenant sees its own adapters and public ones; another tenant's adapter is a 404, the same
answer as for one that does not exist.
"""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.adapters.archive import UploadedFile
from tenancy.adapters.service import AdapterService
from tenancy.auditing.write import record_event, snapshot
from tenancy.auth.authz import require_admin, require_any_admin
from tenancy.auth.principal import AuditContext, Principal
from tenancy.crud.tenants import load_tenant
from tenancy.errors import Conflict, NotFound
from tenancy.ids import new_id
from tenancy.sql.models import Adapter


async def register_adapter(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    service: AdapterService,
    tenant_id: str | None,
    name: str,
    uploads: list[UploadedFile],
) -> Adapter:
    """tenant_id None registers a public adapter (admin only)."""
    if tenant_id is None:
        require_admin(ctx.principal)
    else:
        await load_tenant(session, principal=ctx.principal, tenant_id=tenant_id)
    service.check_name(name)
    validated = service.prepare(uploads)  # everything is checked before anything is written
    clash = await session.scalars(
        select(Adapter.id).where(
            Adapter.name == name,
            Adapter.owner_tenant_id.is_(None)
            if tenant_id is None
            else Adapter.owner_tenant_id == tenant_id,
        )
    )
    if clash.first() is not None:
        raise Conflict("An adapter with this name exists.", param="name")
    adapter_id = new_id()
    path = service.write(owner=tenant_id, adapter_id=adapter_id, adapter=validated)
    spec = validated.spec
    row = Adapter(
        id=adapter_id, owner_tenant_id=tenant_id, name=name, base_model=spec.base_model,
        rank=spec.rank, alpha=spec.alpha, target_modules=list(spec.target_modules),
        sha256=validated.sha256, size_bytes=validated.size_bytes, storage_path=str(path),
        status="ready",
    )  # fmt: skip
    try:
        session.add(row)
        await session.flush()
        record_event(
            session, ctx=ctx, action="adapter.create", object_type="adapter", object_id=row.id,
            tenant_id=tenant_id, before=None, after=snapshot(row),
        )  # fmt: skip
        await session.commit()
    except BaseException as exc:
        await session.rollback()
        service.remove(path)
        if isinstance(exc, IntegrityError):
            raise Conflict("An adapter with this name exists.", param="name") from exc
        raise
    return row


async def list_adapters(
    session: AsyncSession, *, principal: Principal, tenant_id: str
) -> list[Adapter]:
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    query = select(Adapter).where(
        or_(Adapter.owner_tenant_id == tenant_id, Adapter.owner_tenant_id.is_(None))
    )
    return list((await session.scalars(query.order_by(Adapter.created_at))).all())


async def load_adapter(
    session: AsyncSession, *, principal: Principal, tenant_id: str, adapter_id: str
) -> Adapter:
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    row = await session.get(Adapter, adapter_id)
    if row is None or row.owner_tenant_id not in (tenant_id, None):
        raise NotFound("Adapter")
    return row


async def delete_adapter(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    service: AdapterService,
    tenant_id: str,
    adapter_id: str,
) -> str:
    """Returns the deleted adapter's id, the name engines hold it under (for the caller to
    unload it there); its files are gone once the row is."""
    require_any_admin(ctx.principal)
    row = await load_adapter(
        session, principal=ctx.principal, tenant_id=tenant_id, adapter_id=adapter_id
    )
    if row.owner_tenant_id is None:
        require_admin(ctx.principal)  # public adapters belong to the operator
    before = snapshot(row)
    await session.delete(row)
    record_event(
        session, ctx=ctx, action="adapter.delete", object_type="adapter", object_id=adapter_id,
        tenant_id=row.owner_tenant_id, before=before, after=None,
    )  # fmt: skip
    await session.commit()
    service.remove(row.storage_path)
    return adapter_id

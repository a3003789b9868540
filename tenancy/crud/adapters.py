"""Adapters: register (validated, stored, then recorded), list visible, get, delete.

Each row is one immutable version of a name: uploading a name again adds the next version (1,
2, ...) under a new id, never replacing weights an engine may hold or a request may be using.
The name's alias (tenancy/crud/aliases.py) is created with the first version, and moves to a
new one unless the upload asks not to (`activate=False`: stage it for a canary or a later
switch). A version an alias points at cannot be deleted.

A tenant sees its own adapters and public ones; another tenant's adapter is a 404, the same
answer as for one that does not exist.
"""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.adapters.archive import UploadedFile
from tenancy.adapters.errors import AdapterRejected
from tenancy.adapters.service import AdapterService
from tenancy.auditing.write import record_event, snapshot
from tenancy.auth.authz import require_admin, require_any_admin
from tenancy.auth.principal import AuditContext, Principal
from tenancy.crud.aliases import aliases_holding, find_alias, owned_by, point_alias, remove_alias
from tenancy.crud.tenants import load_tenant
from tenancy.errors import Conflict, NotFound
from tenancy.ids import new_id
from tenancy.sql.models import Adapter, Price


async def register_adapter(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    service: AdapterService,
    tenant_id: str | None,
    name: str,
    uploads: list[UploadedFile],
    activate: bool = True,
    base_model: str | None = None,
) -> Adapter:
    """The next version of `name` (tenant_id None: a public adapter, admin only), on
    `base_model` (None: the primary one). The name's alias is created with its first version;
    `activate` moves it to this one (dropping any canary), else the version waits for a switch or
    a canary and serves only as `name@N`. Every version of a name is on one base model, so an
    alias never switches a client's requests to another model."""
    if tenant_id is None:
        require_admin(ctx.principal)
    else:
        await load_tenant(session, principal=ctx.principal, tenant_id=tenant_id)
    service.check_name(name)
    # everything is checked before anything is written
    validated = service.prepare(uploads, base_model)
    latest = (
        await session.scalars(
            select(Adapter)
            .where(owned_by(Adapter.owner_tenant_id, tenant_id), Adapter.name == name)
            .order_by(Adapter.version.desc())
            .limit(1)
        )
    ).first()
    if latest is not None and service.serving_model(latest.base_model) != validated.spec.base_model:
        raise AdapterRejected(
            f"Adapter {name[:200]!r} is on base model "
            f"{service.serving_model(latest.base_model)[:200]!r}; every version of a name is on "
            f"one base model (this upload is for {validated.spec.base_model[:200]!r}).",
            param="base_model",
        )
    adapter_id = new_id()
    stored = await service.write(session, adapter=validated)  # once per content (its sha256)
    spec = validated.spec
    row = Adapter(
        id=adapter_id, owner_tenant_id=tenant_id, name=name, base_model=spec.base_model,
        rank=spec.rank, alpha=spec.alpha, target_modules=list(spec.target_modules),
        sha256=stored.sha256, size_bytes=validated.size_bytes, storage_path=stored.storage_path,
        status="ready", version=latest.version + 1 if latest is not None else 1,
    )  # fmt: skip
    try:
        session.add(row)
        await session.flush()
        record_event(
            session, ctx=ctx, action="adapter.create", object_type="adapter", object_id=row.id,
            tenant_id=tenant_id, before=None, after=snapshot(row),
        )  # fmt: skip
        if latest is not None:
            await _carry_prices(session, ctx=ctx, source=latest.id, target=row.id)
        alias = await find_alias(session, owner=tenant_id, name=name, for_update=True)
        if alias is None or activate:
            point_alias(session, ctx=ctx, alias=alias, version=row)
        await session.commit()
    except BaseException as exc:
        await session.rollback()  # the blob too, when this upload added it
        if isinstance(exc, IntegrityError):
            # Two uploads of one name at once: both took the same next number; one wins.
            raise Conflict(
                "Another version of this name was uploaded at the same time; upload again.",
                param="name",
            ) from exc
        raise
    return row


async def _carry_prices(
    session: AsyncSession, *, ctx: AuditContext, source: str, target: str
) -> None:
    """A price is per version (its adapter id): a new version starts at the price of the one
    before it, so an upload never drops a name to its base model's price unnoticed."""
    for old in (await session.scalars(select(Price).where(Price.adapter_id == source))).all():
        new = Price(
            id=new_id(), model=old.model, adapter_id=target,
            prompt_micros_per_mtok=old.prompt_micros_per_mtok,
            cached_micros_per_mtok=old.cached_micros_per_mtok,
            completion_micros_per_mtok=old.completion_micros_per_mtok,
        )  # fmt: skip
        session.add(new)
        await session.flush()
        record_event(
            session, ctx=ctx, action="price.put", object_type="price", object_id=new.id,
            tenant_id=None, before=None, after=snapshot(new),
        )  # fmt: skip


async def list_adapters(
    session: AsyncSession, *, principal: Principal, tenant_id: str, name: str | None = None
) -> list[Adapter]:
    """Every version the tenant may use (its own and public ones), or the versions of `name`."""
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    query = select(Adapter).where(
        or_(Adapter.owner_tenant_id == tenant_id, Adapter.owner_tenant_id.is_(None))
    )
    if name is not None:
        query = query.where(Adapter.name == name)
        return list((await session.scalars(query.order_by(Adapter.version))).all())
    return list((await session.scalars(query.order_by(Adapter.created_at))).all())


async def list_public_adapters(
    session: AsyncSession, *, principal: Principal, name: str | None = None
) -> list[Adapter]:
    require_any_admin(principal)
    query = select(Adapter).where(Adapter.owner_tenant_id.is_(None))
    if name is not None:
        query = query.where(Adapter.name == name)
    return list((await session.scalars(query.order_by(Adapter.name, Adapter.version))).all())


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
    """Delete one version. Refused (409, naming the alias) while an alias serves it as its
    version or its canary and the name has other versions: switch the alias first. The name's
    only version goes with its alias (as deleting an adapter did before versions). Returns the
    deleted version's id, the name engines hold it under (for the caller to unload it there);
    its files are gone once the row is."""
    require_any_admin(ctx.principal)
    row = await load_adapter(
        session, principal=ctx.principal, tenant_id=tenant_id, adapter_id=adapter_id
    )
    if row.owner_tenant_id is None:
        require_admin(ctx.principal)  # public adapters belong to the operator
    holders = await aliases_holding(session, row.id)
    if holders and await _has_other_versions(session, row):
        alias = holders[0]
        role = "its version" if alias.version_id == row.id else "its canary"
        raise Conflict(
            f"Version {row.version} of {row.name!r} is in use: alias {alias.name!r} serves it as "
            f"{role}. Point the alias at another version (or clear its canary) first, or delete "
            "the alias with every version of the name (DELETE .../adapter-aliases/"
            f"{alias.name}?with_versions=true).",
            param="adapter_id",
        )
    for alias in holders:  # the name's only version: its alias has nothing else to serve
        await remove_alias(session, ctx=ctx, alias=alias)
    if holders:
        await session.flush()  # the alias goes first: it holds its version (RESTRICT)
    before = snapshot(row)
    await session.delete(row)
    record_event(
        session, ctx=ctx, action="adapter.delete", object_type="adapter", object_id=adapter_id,
        tenant_id=row.owner_tenant_id, before=before, after=None,
    )  # fmt: skip
    gone = await service.release(session, sha256=row.sha256, storage_path=row.storage_path)
    await session.commit()
    service.remove(gone)
    return adapter_id


async def _has_other_versions(session: AsyncSession, row: Adapter) -> bool:
    query = select(Adapter.id).where(
        owned_by(Adapter.owner_tenant_id, row.owner_tenant_id),
        Adapter.name == row.name,
        Adapter.id != row.id,
    )
    return (await session.scalars(query.limit(1))).first() is not None


async def delete_name(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    service: AdapterService,
    tenant_id: str | None,
    name: str,
    with_versions: bool,
) -> list[str]:
    """Delete the alias of `name` (tenant_id None: the public one, admin only), and with
    `with_versions` every version of the name too, in one transaction. Returns the ids of the
    versions deleted (the names engines hold them under, to unload them there)."""
    if tenant_id is None:
        require_admin(ctx.principal)
    else:
        await load_tenant(session, principal=ctx.principal, tenant_id=tenant_id)
    alias = await find_alias(session, owner=tenant_id, name=name, for_update=True)
    versions: list[Adapter] = []
    if with_versions:
        query = select(Adapter).where(
            owned_by(Adapter.owner_tenant_id, tenant_id), Adapter.name == name
        )
        versions = list((await session.scalars(query)).all())
    if alias is None and not versions:
        raise NotFound("Alias")
    if alias is not None:
        await remove_alias(session, ctx=ctx, alias=alias)
        await session.flush()  # the alias goes first: it holds its versions (RESTRICT)
    for row in versions:
        before = snapshot(row)
        await session.delete(row)
        record_event(
            session, ctx=ctx, action="adapter.delete", object_type="adapter", object_id=row.id,
            tenant_id=row.owner_tenant_id, before=before, after=None,
        )  # fmt: skip
    gone = [
        path
        for row in versions
        for path in await service.release(session, sha256=row.sha256, storage_path=row.storage_path)
    ]
    await session.commit()
    service.remove(gone)
    return [row.id for row in versions]

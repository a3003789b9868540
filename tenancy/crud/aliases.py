"""Adapter aliases: the name requests use, pointing at one version of that name, or splitting
traffic with a canary version by weight.

An alias and its versions share one owner (a tenant, or NULL for public ones) and one name: a
version is always looked up by (owner, name, number), never by an id a caller sends, so an
alias can point at no other owner's weights. Every change is one UPDATE (or INSERT) of the
alias row in one transaction with its audit event: a request resolves either the old row or
the new one, never half of each. Versions an alias points at cannot be deleted (the API
refuses first, naming the alias; the foreign keys are RESTRICT behind it).

Routes under a tenant act on that tenant's own aliases; public aliases (owner NULL) have their
own routes, changed by admins only. Reads under a tenant fall back to the public alias of the
name, which is what `model: name` resolves to when the tenant has none of its own.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute
from sqlalchemy.sql.elements import ColumnElement

from tenancy.auditing.write import record_event, snapshot
from tenancy.auth.authz import require_admin, require_any_admin
from tenancy.auth.principal import AuditContext, Principal
from tenancy.crud.tenants import load_tenant
from tenancy.errors import BadRequest, NotFound
from tenancy.ids import new_id
from tenancy.schemas import AliasOut
from tenancy.sql.models import Adapter, AdapterAlias, utcnow

# A version's recorded base model -> the one it serves on (AdapterService.serving_model).
ServingModel = Callable[[str], str]


def owned_by(column: InstrumentedAttribute[str | None], owner: str | None) -> ColumnElement[bool]:
    return column.is_(None) if owner is None else column == owner


async def check_scope(
    session: AsyncSession, *, principal: Principal, owner: str | None, is_change: bool
) -> None:
    """A tenant's aliases: its admins and the admin (like its adapters). Public ones: any admin
    reads them, only the admin changes them."""
    if owner is not None:
        await load_tenant(session, principal=principal, tenant_id=owner)
    elif is_change:
        require_admin(principal)
    else:
        require_any_admin(principal)


async def find_version(
    session: AsyncSession, *, owner: str | None, name: str, version: int
) -> Adapter:
    row = (
        await session.scalars(
            select(Adapter).where(
                owned_by(Adapter.owner_tenant_id, owner),
                Adapter.name == name,
                Adapter.version == version,
            )
        )
    ).first()
    if row is None:
        raise NotFound("Adapter version")
    return row


async def find_alias(
    session: AsyncSession, *, owner: str | None, name: str, for_update: bool = False
) -> AdapterAlias | None:
    query = select(AdapterAlias).where(
        owned_by(AdapterAlias.owner_tenant_id, owner), AdapterAlias.name == name
    )
    if for_update:  # concurrent changes of one alias queue up (PostgreSQL; SQLite serializes)
        query = query.with_for_update()
    return (await session.scalars(query)).first()


async def aliases_holding(session: AsyncSession, adapter_id: str) -> list[AdapterAlias]:
    """The aliases that point at this version, as their version or as their canary."""
    query = select(AdapterAlias).where(
        or_(AdapterAlias.version_id == adapter_id, AdapterAlias.canary_version_id == adapter_id)
    )
    return list((await session.scalars(query)).all())


async def alias_out(session: AsyncSession, row: AdapterAlias) -> AliasOut:
    ids = [i for i in (row.version_id, row.canary_version_id) if i is not None]
    found = await session.execute(select(Adapter.id, Adapter.version).where(Adapter.id.in_(ids)))
    numbers = {adapter_id: number for adapter_id, number in found.all()}
    canary = row.canary_version_id
    return AliasOut(
        owner_tenant_id=row.owner_tenant_id,
        name=row.name,
        version=numbers[row.version_id],
        version_id=row.version_id,
        canary_version=numbers[canary] if canary is not None else None,
        canary_version_id=canary,
        canary_weight=row.canary_weight,
        updated_at=row.updated_at,
    )


def point_alias(
    session: AsyncSession, *, ctx: AuditContext, alias: AdapterAlias | None, version: Adapter
) -> AdapterAlias:
    """Create the alias of `version`'s name, or point it at `version` alone (a canary is
    dropped: after a switch the alias serves exactly one version). Part of the caller's
    transaction, with its audit event."""
    if alias is None:
        alias = AdapterAlias(
            id=new_id(), owner_tenant_id=version.owner_tenant_id, name=version.name,
            version_id=version.id, canary_version_id=None, canary_weight=0, updated_at=utcnow(),
        )  # fmt: skip
        session.add(alias)
        before, action = None, "alias.create"
    else:
        before, action = snapshot(alias), "alias.switch"
        alias.version_id = version.id
        alias.canary_version_id = None
        alias.canary_weight = 0
        alias.updated_at = utcnow()
    record_event(
        session, ctx=ctx, action=action, object_type="adapter_alias", object_id=alias.id,
        tenant_id=version.owner_tenant_id, before=before, after=snapshot(alias),
    )  # fmt: skip
    return alias


async def get_alias(
    session: AsyncSession, *, principal: Principal, tenant_id: str | None, name: str
) -> AliasOut:
    await check_scope(session, principal=principal, owner=tenant_id, is_change=False)
    row = await find_alias(session, owner=tenant_id, name=name)
    if row is None and tenant_id is not None and not await _owns_name(session, tenant_id, name):
        row = await find_alias(session, owner=None, name=name)
    if row is None:
        raise NotFound("Alias")
    return await alias_out(session, row)


async def _owns_name(session: AsyncSession, tenant_id: str, name: str) -> bool:
    """Any version of `name` is the tenant's: the public name of the same spelling is hidden
    from it (as request resolution hides it)."""
    query = select(Adapter.id).where(Adapter.owner_tenant_id == tenant_id, Adapter.name == name)
    return (await session.scalars(query.limit(1))).first() is not None


async def list_aliases(
    session: AsyncSession, *, principal: Principal, tenant_id: str | None
) -> list[AliasOut]:
    """A tenant's aliases and the public ones (the tenant's own wins a shared name when a
    request resolves it); without a tenant, the public ones."""
    await check_scope(session, principal=principal, owner=tenant_id, is_change=False)
    query = select(AdapterAlias).where(
        owned_by(AdapterAlias.owner_tenant_id, None)
        if tenant_id is None
        else or_(AdapterAlias.owner_tenant_id == tenant_id, AdapterAlias.owner_tenant_id.is_(None))
    )
    rows = (await session.scalars(query.order_by(AdapterAlias.name))).all()
    return [await alias_out(session, row) for row in rows]


async def switch_alias(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    tenant_id: str | None,
    name: str,
    version: int,
    serving_model: ServingModel | None = None,
) -> AliasOut:
    """Point the alias at `version` (creating it if it was deleted): the switch, the
    promotion of a canary and the rollback are all this. `serving_model` (the adapter service's)
    maps a version's recorded base model to the one it serves on: a switch to another base
    model is a 400."""
    await check_scope(session, principal=ctx.principal, owner=tenant_id, is_change=True)
    target = await find_version(session, owner=tenant_id, name=name, version=version)
    alias = await find_alias(session, owner=tenant_id, name=name, for_update=True)
    if alias is not None and serving_model is not None:
        await _check_base_model(session, alias=alias, target=target, serving_model=serving_model)
    alias = point_alias(session, ctx=ctx, alias=alias, version=target)
    await session.flush()
    out = await alias_out(session, alias)
    await session.commit()
    return out


async def set_canary(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    tenant_id: str | None,
    name: str,
    version: int,
    weight: int,
    serving_model: ServingModel | None = None,
) -> AliasOut:
    """`weight` percent (1-99) of the alias's requests go to `version`, the rest to the alias's
    own version; setting it again replaces the canary."""
    await check_scope(session, principal=ctx.principal, owner=tenant_id, is_change=True)
    if not 1 <= weight <= 99:
        raise BadRequest("The canary's weight is a percentage from 1 to 99.", param="weight")
    canary = await find_version(session, owner=tenant_id, name=name, version=version)
    alias = await find_alias(session, owner=tenant_id, name=name, for_update=True)
    if alias is None:
        raise NotFound("Alias")
    if canary.id == alias.version_id:
        raise BadRequest(
            f"Version {version} is what alias {name!r} serves already; a canary is another "
            "version.",
            param="version",
        )
    if serving_model is not None:
        await _check_base_model(session, alias=alias, target=canary, serving_model=serving_model)
    before = snapshot(alias)
    alias.canary_version_id = canary.id
    alias.canary_weight = weight
    alias.updated_at = utcnow()
    return await _commit_change(session, ctx=ctx, alias=alias, before=before, action="canary_set")


async def _check_base_model(
    session: AsyncSession, *, alias: AdapterAlias, target: Adapter, serving_model: ServingModel
) -> None:
    """An alias serves one base model: a client naming it never lands on another model."""
    current = await session.get(Adapter, alias.version_id)
    if current is None:
        return
    have, want = serving_model(current.base_model), serving_model(target.base_model)
    if have != want:
        raise BadRequest(
            f"Version {target.version} of {alias.name[:200]!r} is on base model {want[:200]!r}; "
            f"the alias serves base model {have[:200]!r}.",
            param="version",
        )


async def clear_canary(
    session: AsyncSession, *, ctx: AuditContext, tenant_id: str | None, name: str
) -> AliasOut:
    """Every request of the alias to its version again (a canary that failed: its rollback)."""
    await check_scope(session, principal=ctx.principal, owner=tenant_id, is_change=True)
    alias = await find_alias(session, owner=tenant_id, name=name, for_update=True)
    if alias is None:
        raise NotFound("Alias")
    before = snapshot(alias)
    alias.canary_version_id = None
    alias.canary_weight = 0
    alias.updated_at = utcnow()
    return await _commit_change(session, ctx=ctx, alias=alias, before=before, action="canary_clear")


async def _commit_change(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    alias: AdapterAlias,
    before: dict[str, object] | None,
    action: str,
) -> AliasOut:
    record_event(
        session, ctx=ctx, action=f"alias.{action}", object_type="adapter_alias",
        object_id=alias.id, tenant_id=alias.owner_tenant_id, before=before, after=snapshot(alias),
    )  # fmt: skip
    await session.flush()
    out = await alias_out(session, alias)
    await session.commit()
    return out


async def remove_alias(session: AsyncSession, *, ctx: AuditContext, alias: AdapterAlias) -> None:
    """Part of the caller's transaction: `model: name` is a 404 from then on (`name@N` still
    serves each version that is left)."""
    before = snapshot(alias)
    await session.delete(alias)
    record_event(
        session, ctx=ctx, action="alias.delete", object_type="adapter_alias", object_id=alias.id,
        tenant_id=alias.owner_tenant_id, before=before, after=None,
    )  # fmt: skip

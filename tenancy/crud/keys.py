"""API keys: create (clear key returned once), list masked, rotate with grace, revoke."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auditing.write import record_event, snapshot
from tenancy.auth.authz import require_grantable
from tenancy.auth.key_format import KeyMinter, MintedKey
from tenancy.auth.principal import AuditContext, Principal
from tenancy.auth.scopes import Scope
from tenancy.crud.tenants import load_tenant
from tenancy.errors import BadRequest, Conflict, NotFound
from tenancy.ids import new_id
from tenancy.schemas import ApiKeyCreate, ApiKeyCreated, ApiKeyOut
from tenancy.sql.models import ApiKey, Tenant


def _created(row: ApiKey, minted: MintedKey) -> ApiKeyCreated:
    return ApiKeyCreated(**ApiKeyOut.model_validate(row).model_dump(), key=minted.clear)


def _new_row(
    minted: MintedKey,
    *,
    tenant_id: str,
    name: str,
    scopes: list[str],
    expires_at: dt.datetime | None,
) -> ApiKey:
    return ApiKey(
        id=new_id(),
        tenant_id=tenant_id,
        name=name,
        prefix=minted.parts.prefix,
        last_four=minted.parts.last_four,
        key_hash=minted.key_hash,
        scopes=scopes,
        expires_at=expires_at,
    )


async def create_key(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    minter: KeyMinter,
    tenant_id: str,
    data: ApiKeyCreate,
    now: dt.datetime,
) -> ApiKeyCreated:
    await load_tenant(session, principal=ctx.principal, tenant_id=tenant_id)
    scopes = frozenset(data.scopes)
    require_grantable(ctx.principal, scopes)
    if data.expires_at is not None and data.expires_at <= now:
        raise BadRequest("expires_at must be in the future.", param="expires_at")
    minted = minter.mint()
    row = _new_row(
        minted,
        tenant_id=tenant_id,
        name=data.name,
        scopes=sorted(scopes),
        expires_at=data.expires_at,
    )
    session.add(row)
    await session.flush()
    record_event(
        session, ctx=ctx, action="key.create", object_type="api_key", object_id=row.id,
        tenant_id=tenant_id, before=None, after=snapshot(row),
    )  # fmt: skip
    await session.commit()
    return _created(row, minted)


async def list_keys(session: AsyncSession, *, principal: Principal, tenant_id: str) -> list[ApiKey]:
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    query = select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at)
    return list((await session.scalars(query)).all())


async def load_key(
    session: AsyncSession, *, principal: Principal, tenant_id: str, key_id: str
) -> ApiKey:
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    row = await session.get(ApiKey, key_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound("API key")
    return row


async def rotate_key(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    minter: KeyMinter,
    tenant_id: str,
    key_id: str,
    grace: dt.timedelta,
    now: dt.datetime,
) -> ApiKeyCreated:
    """A new key with the same name, scopes and expiry; the old one works until now + grace."""
    old = await load_key(session, principal=ctx.principal, tenant_id=tenant_id, key_id=key_id)
    require_grantable(ctx.principal, frozenset(Scope(s) for s in old.scopes))
    if old.revoked_at is not None or old.replaced_by_id is not None:
        raise Conflict("This key is revoked or already rotated.")
    before = snapshot(old)
    minted = minter.mint()
    new = _new_row(
        minted, tenant_id=tenant_id, name=old.name, scopes=old.scopes, expires_at=old.expires_at
    )
    session.add(new)
    old.replaced_by_id = new.id
    old.rotation_grace_until = now + grace
    await session.flush()
    record_event(
        session, ctx=ctx, action="key.rotate", object_type="api_key", object_id=old.id,
        tenant_id=tenant_id, before=before, after=snapshot(old),
    )  # fmt: skip
    record_event(
        session, ctx=ctx, action="key.create", object_type="api_key", object_id=new.id,
        tenant_id=tenant_id, before=None, after=snapshot(new),
    )  # fmt: skip
    await session.commit()
    return _created(new, minted)


async def revoke_key(
    session: AsyncSession, *, ctx: AuditContext, tenant_id: str, key_id: str, now: dt.datetime
) -> ApiKey:
    row = await load_key(session, principal=ctx.principal, tenant_id=tenant_id, key_id=key_id)
    require_grantable(ctx.principal, frozenset(Scope(s) for s in row.scopes))
    if row.revoked_at is not None:
        return row
    before = snapshot(row)
    row.revoked_at = now
    record_event(
        session, ctx=ctx, action="key.revoke", object_type="api_key", object_id=row.id,
        tenant_id=tenant_id, before=before, after=snapshot(row),
    )  # fmt: skip
    await session.commit()
    return row


async def find_by_hash(session: AsyncSession, *, key_hash: str) -> tuple[ApiKey, Tenant] | None:
    query = select(ApiKey, Tenant).join(Tenant, Tenant.id == ApiKey.tenant_id)
    row = (await session.execute(query.where(ApiKey.key_hash == key_hash))).first()
    return None if row is None else (row[0], row[1])

"""Create the first admin key (in an `operator` tenant), once."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auth.key_format import KeyMinter
from tenancy.auth.principal import AuditContext, Principal
from tenancy.auth.scopes import Scope
from tenancy.crud.keys import create_key
from tenancy.crud.tenants import create_tenant
from tenancy.errors import Conflict
from tenancy.schemas import ApiKeyCreate, ApiKeyCreated, TenantCreate
from tenancy.sql.models import ApiKey, Tenant

OPERATOR_TENANT = "operator"
BOOTSTRAP_CTX = AuditContext(
    principal=Principal(subject="system:bootstrap", tenant_id=None, scopes=frozenset({Scope.ADMIN}))
)


async def bootstrap_admin(
    session: AsyncSession,
    *,
    minter: KeyMinter,
    tiers: frozenset[str],
    default_tier: str,
    force: bool = False,
) -> ApiKeyCreated:
    if not force:
        keys = await session.scalars(select(ApiKey).where(ApiKey.revoked_at.is_(None)))
        if any(Scope.ADMIN in k.scopes for k in keys):
            raise Conflict("An admin key exists already; pass --force to create another.")
    tenant = (await session.scalars(select(Tenant).where(Tenant.name == OPERATOR_TENANT))).first()
    if tenant is None:
        tenant = await create_tenant(
            session,
            ctx=BOOTSTRAP_CTX,
            data=TenantCreate(name=OPERATOR_TENANT),
            tiers=tiers,
            default_tier=default_tier,
        )
    return await create_key(
        session,
        ctx=BOOTSTRAP_CTX,
        minter=minter,
        tenant_id=tenant.id,
        data=ApiKeyCreate(name="bootstrap-admin", scopes=[Scope.ADMIN]),
        now=dt.datetime.now(dt.UTC),
    )

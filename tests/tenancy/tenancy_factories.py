"""Test factories: tenants and keys created through the real CRUD functions; and a tenant row
written in plain SQL, for the migration tests (a schema at any revision, before the models')."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from tenancy.auth.key_format import KeyMinter
from tenancy.auth.principal import AuditContext, Principal
from tenancy.auth.scopes import Scope
from tenancy.crud.keys import create_key
from tenancy.crud.tenants import create_tenant
from tenancy.schemas import ApiKeyCreate, ApiKeyCreated, TenantCreate
from tenancy.sql.models import Tenant

ADMIN_CTX = AuditContext(
    principal=Principal(subject="test:admin", tenant_id=None, scopes=frozenset({Scope.ADMIN}))
)
TIERS = frozenset({"realtime", "standard", "batch"})


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def make_tenant(session: AsyncSession, name: str | None = None) -> Tenant:
    data = TenantCreate(name=name or f"t-{uuid.uuid4().hex[:8]}")
    return await create_tenant(
        session, ctx=ADMIN_CTX, data=data, tiers=TIERS, default_tier="standard"
    )


async def make_key(
    session: AsyncSession,
    minter: KeyMinter,
    tenant_id: str,
    scopes: tuple[Scope, ...] = (Scope.INFERENCE,),
    expires_at: dt.datetime | None = None,
    ctx: AuditContext = ADMIN_CTX,
) -> ApiKeyCreated:
    data = ApiKeyCreate(name="k", scopes=list(scopes), expires_at=expires_at)
    return await create_key(
        session, ctx=ctx, minter=minter, tenant_id=tenant_id, data=data, now=utcnow()
    )


class SecretRegistry:
    """Every key and salt a test creates; none may appear in any log record of the run."""

    def __init__(self) -> None:
        self.values: set[str] = set()

    def add(self, value: str) -> str:
        self.values.add(value)
        return value


async def insert_tenant_row(conn: AsyncConnection, tenant_id: str, name: str) -> None:
    """A tenant as every revision's `tenants` table holds it (unchanged since 0001)."""
    await conn.execute(
        text(
            "INSERT INTO tenants (id, name, tier, status, salt_epoch, created_at, updated_at) "
            "VALUES (:id, :name, 'standard', 'active', 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
        ),
        {"id": tenant_id, "name": name},
    )

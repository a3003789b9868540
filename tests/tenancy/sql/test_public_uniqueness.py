"""Public adapters and aliases (no owner) are unique by name like a tenant's: a unique
constraint treats NULL owners as distinct, so partial unique indexes carry it (migration 0005).
Without them two simultaneous public uploads of one name could both take version 2, or both
create the name's alias. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from tenancy_factories import insert_tenant_row

from tenancy.sql.migrate import upgrade
from tenancy.sql.session import make_engine

TENANTS = ("00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002")
ADAPTER = (
    "INSERT INTO adapters (id, owner_tenant_id, name, version, base_model, rank, alpha, "
    "target_modules, sha256, size_bytes, storage_path, status, created_at) VALUES (:id, :owner, "
    "'sql', :version, 'tiny', 8, 16, '[\"q_proj\"]', :sha, 100, NULL, 'ready', CURRENT_TIMESTAMP)"
)
ALIAS = (
    "INSERT INTO adapter_aliases (id, owner_tenant_id, name, version_id, canary_weight, "
    "updated_at) VALUES (:id, :owner, 'sql', :version_id, 0, CURRENT_TIMESTAMP)"
)


def _id(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


async def _check(url: str) -> None:
    engine = make_engine(url)
    try:
        await upgrade(engine)
        async with engine.begin() as conn:
            for tenant in TENANTS:
                await insert_tenant_row(conn, tenant, tenant)
            # One name, version 2, for each tenant and for the public: all distinct owners.
            for n, owner in enumerate((*TENANTS, None), start=10):
                await conn.execute(
                    text(ADAPTER), {"id": _id(n), "owner": owner, "version": 2, "sha": "a" * 64}
                )
                await conn.execute(
                    text(ALIAS), {"id": _id(n + 10), "owner": owner, "version_id": _id(n)}
                )
        for statement, values in (
            (ADAPTER, {"id": _id(30), "owner": None, "version": 2, "sha": "b" * 64}),
            (ALIAS, {"id": _id(31), "owner": None, "version_id": _id(12)}),
        ):
            with pytest.raises(IntegrityError):
                async with engine.begin() as conn:
                    await conn.execute(text(statement), values)
        async with engine.begin() as conn:  # another public version number is fine
            await conn.execute(
                text(ADAPTER), {"id": _id(32), "owner": None, "version": 3, "sha": "c" * 64}
            )
    finally:
        await engine.dispose()


async def test_public_names_are_unique_sqlite(sqlite_url: str) -> None:
    await _check(sqlite_url)


@pytest.mark.postgres
async def test_public_names_are_unique_postgres(postgres_url: str) -> None:
    await _check(postgres_url)

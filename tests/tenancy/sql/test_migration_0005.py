"""Migration 0005 on a database with adapters: each becomes version 1 of its name, with an alias
of that name pointing at it, so every `model` a client used before resolves to the same
weights; on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from tenancy_factories import insert_tenant_row

from tenancy.sql.migrate import downgrade, upgrade
from tenancy.sql.session import make_engine

TENANT = "00000000-0000-4000-8000-000000000001"
OWNED = "00000000-0000-4000-8000-00000000000a"
PUBLIC = "00000000-0000-4000-8000-00000000000b"


async def _adapters_become_versions_with_aliases(url: str) -> None:
    engine = make_engine(url)
    try:
        await upgrade(engine, "0004")
        async with engine.begin() as conn:
            await insert_tenant_row(conn, TENANT, "acme")
            for adapter_id, owner, name in ((OWNED, TENANT, "support"), (PUBLIC, None, "sql")):
                await conn.execute(
                    text(
                        "INSERT INTO adapters (id, owner_tenant_id, name, base_model, rank, "
                        "alpha, target_modules, sha256, size_bytes, storage_path, status, "
                        "created_at) VALUES (:id, :owner, :name, 'tiny', 8, 16, '[\"q_proj\"]', "
                        ":sha, 100, '/store/x', 'ready', CURRENT_TIMESTAMP)"
                    ),
                    {"id": adapter_id, "owner": owner, "name": name, "sha": "a" * 64},
                )
        await upgrade(engine)
        async with engine.connect() as conn:
            versions = dict((await conn.execute(text("SELECT id, version FROM adapters"))).all())
            assert versions == {OWNED: 1, PUBLIC: 1}
            aliases = (
                await conn.execute(
                    text(
                        "SELECT owner_tenant_id, name, version_id, canary_version_id, "
                        "canary_weight FROM adapter_aliases ORDER BY name"
                    )
                )
            ).all()
            assert [tuple(a) for a in aliases] == [
                (None, "sql", PUBLIC, None, 0),
                (TENANT, "support", OWNED, None, 0),
            ]
            # the alias holds its version: RESTRICT refuses deleting what it points at
            with pytest.raises(Exception, match=r"(?i)foreign key|constraint"):
                await conn.execute(text("DELETE FROM adapters WHERE id = :id"), {"id": OWNED})
        async with engine.begin() as conn:
            # ...but deleting the tenant takes its aliases and versions together
            await conn.execute(text("DELETE FROM tenants WHERE id = :id"), {"id": TENANT})
        async with engine.connect() as conn:
            left = (await conn.execute(text("SELECT id FROM adapters"))).scalars().all()
            assert left == [PUBLIC]
        async with engine.begin() as conn:
            # The database store: no path. Downgrading must still go through (0004's column is
            # NOT NULL); later versions go, as 0004 allows one row a name.
            await conn.execute(text("UPDATE adapters SET storage_path = NULL"))
            await conn.execute(
                text(
                    "INSERT INTO adapters (id, owner_tenant_id, name, version, base_model, rank, "
                    "alpha, target_modules, sha256, size_bytes, storage_path, status, "
                    "created_at) VALUES (:id, NULL, 'sql', 2, 'tiny', 8, 16, '[\"q_proj\"]', "
                    ":sha, 100, NULL, 'ready', CURRENT_TIMESTAMP)"
                ),
                {"id": OWNED, "sha": "b" * 64},
            )
        await downgrade(engine, "0004")
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT id, storage_path FROM adapters"))).all()
            assert [tuple(r) for r in rows] == [(PUBLIC, "")]
    finally:
        await engine.dispose()


async def test_0005_turns_adapters_into_aliased_versions_sqlite(sqlite_url: str) -> None:
    await _adapters_become_versions_with_aliases(sqlite_url)


@pytest.mark.postgres
async def test_0005_turns_adapters_into_aliased_versions_postgres(postgres_url: str) -> None:
    await _adapters_become_versions_with_aliases(postgres_url)

"""Acceptance 1: upgrade, downgrade to base, upgrade again; autogenerate finds no difference."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from tenancy.sql.migrate import downgrade, upgrade
from tenancy.sql.models import Base
from tenancy.sql.session import make_engine

TABLES = {
    "tenants", "api_keys", "quota_policies", "adapters", "usage_records", "audit_events",
    "dashboard_logouts", "prices", "alert_webhooks", "alert_firings", "alert_deliveries",
    "alert_delivery_attempts", "adapter_blobs", "adapter_aliases",
}  # fmt: skip


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names()) - {"alembic_version"}


def _diff(conn: Connection) -> list[object]:
    ctx = MigrationContext.configure(conn, opts={"compare_type": True})
    return list(compare_metadata(ctx, Base.metadata))


async def _round_trip(url: str) -> None:
    engine = make_engine(url)
    try:
        await upgrade(engine)
        async with engine.connect() as conn:
            assert await conn.run_sync(_tables) == TABLES
        await downgrade(engine, "base")
        async with engine.connect() as conn:
            assert await conn.run_sync(_tables) == set()
        await upgrade(engine)
        async with engine.connect() as conn:
            assert await conn.run_sync(_tables) == TABLES
            assert await conn.run_sync(_diff) == []
    finally:
        await engine.dispose()


async def test_migrations_round_trip_sqlite(sqlite_url: str) -> None:
    await _round_trip(sqlite_url)


@pytest.mark.postgres
async def test_migrations_round_trip_postgres(postgres_url: str) -> None:
    await _round_trip(postgres_url)

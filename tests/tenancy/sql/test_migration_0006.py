"""Migration 0006 on a database with quota policies: they become the all-models policies (model
NULL), a model's policy may stand beside each, one row per (tenant, key, model); downgrading
drops the models' policies and keeps the rest; on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from tenancy_factories import insert_tenant_row

from tenancy.sql.migrate import downgrade, upgrade
from tenancy.sql.session import make_engine

TENANT = "00000000-0000-4000-8000-000000000001"
KEY = "00000000-0000-4000-8000-00000000000c"
INSERT = (
    "INSERT INTO quota_policies (id, tenant_id, api_key_id, {cols}requests_per_minute, "
    "updated_at) VALUES (:id, :tenant, :key, {vals}:rpm, CURRENT_TIMESTAMP)"
)


def _insert(model: bool) -> str:
    return INSERT.format(cols="model, " if model else "", vals=":model, " if model else "")


async def _policies_gain_a_model(url: str) -> None:
    engine = make_engine(url)
    try:
        await upgrade(engine, "0005")
        async with engine.begin() as conn:
            await insert_tenant_row(conn, TENANT, "acme")
            await conn.execute(
                text(
                    "INSERT INTO api_keys (id, tenant_id, name, prefix, last_four, key_hash, "
                    "scopes, created_at) VALUES (:id, :tenant, 'k', 'lg', 'abcd', :hash, "
                    "'[\"inference\"]', CURRENT_TIMESTAMP)"
                ),
                {"id": KEY, "tenant": TENANT, "hash": "h" * 64},
            )
            for policy_id, key, rpm in (("p1", None, 10), ("p2", KEY, 5)):
                await conn.execute(
                    text(_insert(False)),
                    {"id": policy_id, "tenant": TENANT, "key": key, "rpm": rpm},
                )
        await upgrade(engine)
        async with engine.begin() as conn:
            rows = (
                await conn.execute(text("SELECT id, model FROM quota_policies ORDER BY id"))
            ).all()
            assert [tuple(r) for r in rows] == [("p1", None), ("p2", None)]
            for policy_id, key in (("p3", None), ("p4", KEY)):
                await conn.execute(
                    text(_insert(True)),
                    {"id": policy_id, "tenant": TENANT, "key": key, "model": "small", "rpm": 2},
                )
        # one row per (tenant, key, model)
        with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
            async with engine.begin() as conn:
                await conn.execute(
                    text(_insert(True)),
                    {"id": "p5", "tenant": TENANT, "key": KEY, "model": "small", "rpm": 1},
                )
        await downgrade(engine, "0005")
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT id, api_key_id, requests_per_minute FROM quota_policies ORDER BY id"
                    )
                )
            ).all()
            assert [tuple(r) for r in rows] == [("p1", None, 10), ("p2", KEY, 5)]
        # 0005's constraint is back: a key's second policy is refused
        with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
            async with engine.begin() as conn:
                await conn.execute(
                    text(_insert(False)), {"id": "p6", "tenant": TENANT, "key": KEY, "rpm": 1}
                )
        await upgrade(engine)
    finally:
        await engine.dispose()


async def test_0006_gives_policies_a_model_sqlite(sqlite_url: str) -> None:
    await _policies_gain_a_model(sqlite_url)


@pytest.mark.postgres
async def test_0006_gives_policies_a_model_postgres(postgres_url: str) -> None:
    await _policies_gain_a_model(postgres_url)

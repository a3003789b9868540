"""Async engine and session factory for SQLite (embedded) and PostgreSQL (distributed)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)


def make_engine(database_url: str, **kwargs: Any) -> AsyncEngine:
    if not database_url.startswith("sqlite"):
        # A server that restarted leaves dead connections in the pool: a ping at checkout
        # replaces them, so the first request after an outage succeeds. The hot path reaches
        # the database only on cache misses and in ledger batches, so the ping costs little.
        kwargs.setdefault("pool_pre_ping", True)
    engine = create_async_engine(database_url, **kwargs)
    if engine.dialect.name == "sqlite":
        # SQLite ignores ON DELETE CASCADE unless foreign keys are switched on per connection.
        @event.listens_for(engine.sync_engine, "connect")
        def _fk_on(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

    return engine


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)

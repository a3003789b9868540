"""Alembic configured programmatically, so the repository root keeps no alembic.ini of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(database_url: str | None = None) -> Config:
    config = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url:
        # ConfigParser interpolation: a literal % in a password must be doubled.
        config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    config.attributes["skip_logging_config"] = True
    return config


def _run(connection: Connection, action: str, revision: str, kwargs: dict[str, Any]) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    getattr(command, action)(config, revision, **kwargs)


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    async with engine.begin() as conn:
        await conn.run_sync(_run, "upgrade", revision, {})


async def downgrade(engine: AsyncEngine, revision: str = "base") -> None:
    async with engine.begin() as conn:
        await conn.run_sync(_run, "downgrade", revision, {})


def head_revision() -> str | None:
    """The newest revision this code ships (what the schema must be at to serve)."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    """The database's revision; None for a database never migrated."""

    def read(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    async with engine.connect() as conn:
        return await conn.run_sync(read)


class SchemaOutOfDate(RuntimeError):
    """The database's schema is not the one this code needs."""

    def __init__(self, current: str | None, head: str | None) -> None:
        where = "has never been migrated" if current is None else f"is at revision {current}"
        super().__init__(
            f"the database {where}; this version needs {head}: run `loragate admin migrate` "
            "(or set LORAGATE_AUTO_MIGRATE=true)"
        )


async def check_schema(engine: AsyncEngine) -> None:
    """Raises SchemaOutOfDate unless the database is at this code's head revision."""
    current, head = await current_revision(engine), head_revision()
    if current != head:
        raise SchemaOutOfDate(current, head)

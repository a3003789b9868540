"""Alembic configured programmatically, so the repository root keeps no alembic.ini of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


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

"""`loragate admin ...`: migrate the database and bootstrap the first admin key."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tenancy.bootstrap import bootstrap_admin
from tenancy.db import make_engine, make_sessionmaker
from tenancy.errors import ClientError
from tenancy.keys import KeyMinter
from tenancy.migrate import upgrade
from tenancy.settings import TenancySettings


def add_subcommands(subparsers: Any) -> None:
    admin = subparsers.add_parser("admin", help="tenancy administration")
    commands = admin.add_subparsers(dest="admin_command", required=True)
    migrate = commands.add_parser("migrate", help="upgrade the database schema to head")
    migrate.set_defaults(handler=_migrate)
    boot = commands.add_parser(
        "bootstrap", help="migrate, then create the first admin key and print it once"
    )
    boot.add_argument("--force", action="store_true", help="create one even if one exists")
    boot.set_defaults(handler=_bootstrap)


def _settings() -> TenancySettings | None:
    try:
        return TenancySettings()  # type: ignore[call-arg]  # secrets come from the environment
    except ValidationError as exc:
        names = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
        print(f"invalid settings (LORAGATE_*): {names}", file=sys.stderr)
        return None


def _ensure_sqlite_dir(url: str) -> None:
    if url.startswith("sqlite") and ":///" in url:
        path = url.split(":///", 1)[1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)


async def _migrate_async(settings: TenancySettings) -> None:
    _ensure_sqlite_dir(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


def _migrate(args: argparse.Namespace) -> int:
    settings = _settings()
    if settings is None:
        return 2
    asyncio.run(_migrate_async(settings))
    return 0


async def _bootstrap_async(settings: TenancySettings, force: bool) -> str:
    await _migrate_async(settings)
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            created = await bootstrap_admin(
                session,
                minter=KeyMinter(
                    prefix=settings.key_prefix,
                    pepper=settings.key_pepper.get_secret_value().encode(),
                ),
                tiers=frozenset(settings.tiers),
                default_tier=settings.default_tier,
                force=force,
            )
    finally:
        await engine.dispose()
    return created.key


def _bootstrap(args: argparse.Namespace) -> int:
    settings = _settings()
    if settings is None:
        return 2
    try:
        key = asyncio.run(_bootstrap_async(settings, args.force))
    except ClientError as exc:
        print(exc.message, file=sys.stderr)
        return 1
    # The only place the key is ever shown; stdout, never a log.
    print("Admin API key (shown once, store it now):", file=sys.stderr)
    print(key)
    return 0

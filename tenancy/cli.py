"""`loragate admin ...`: migrate the database and bootstrap the first admin key (on the database);
every other admin command goes through the REST API (tenancy/admin_cli/)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tenancy.admin_cli import add_rest_commands

if TYPE_CHECKING:
    from tenancy.settings import TenancySettings

# The handlers import the settings, SQL and key code when they run: building the argument tree
# (`loragate admin --help`, any REST command) stays light (gateway/cli.py).
STATE_HELP = (
    "a state directory (the demo's is .cache/demo): its secrets and SQLite database instead of "
    "the LORAGATE_* environment"
)
# Where `make run` keeps its state, for the hint when secrets are missing.
DEMO_STATE = ".cache/demo"


def add_subcommands(subparsers: Any) -> None:
    admin = subparsers.add_parser("admin", help="tenancy administration")
    commands = admin.add_subparsers(dest="admin_command", required=True)
    migrate = commands.add_parser("migrate", help="upgrade the database schema to head")
    migrate.add_argument("--dir", type=Path, default=None, help=STATE_HELP)
    migrate.set_defaults(handler=_migrate)
    boot = commands.add_parser(
        "bootstrap", help="migrate, then create the first admin key and print it once"
    )
    boot.add_argument("--force", action="store_true", help="create one even if one exists")
    boot.add_argument("--dir", type=Path, default=None, help=STATE_HELP)
    boot.set_defaults(handler=_bootstrap)
    add_rest_commands(commands)  # tenants, keys, quotas, adapters, usage, audit: over the API


def _settings(state_dir: Path | None) -> TenancySettings | None:
    """From the environment, or from a state directory; on a problem, say what and where."""
    from pydantic import ValidationError

    from tenancy.settings import TenancySettings
    from tenancy.state_dir import SECRETS_FILE, NoStateDir, state_settings

    try:
        values = {} if state_dir is None else state_settings(state_dir, create=False)
        return TenancySettings(**values)  # type: ignore[arg-type]
    except NoStateDir as exc:
        print(f"loragate admin: {exc}", file=sys.stderr)
        return None
    except ValidationError as exc:
        names = [".".join(str(p) for p in e["loc"]) for e in exc.errors()]
        print(f"invalid settings (LORAGATE_*): {', '.join(names)}", file=sys.stderr)
        if state_dir is None and {"key_pepper", "salt_secret"} & set(names):
            print(
                "  LORAGATE_KEY_PEPPER and LORAGATE_SALT_SECRET must be set, with the same "
                "values the gateway uses. For the demo's state, pass "
                f"--dir {DEMO_STATE} (the demo keeps them in {DEMO_STATE}/{SECRETS_FILE}, "
                "next to its database).",
                file=sys.stderr,
            )
        return None


def _ensure_sqlite_dir(url: str) -> None:
    if url.startswith("sqlite") and ":///" in url:
        path = url.split(":///", 1)[1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)


async def _migrate_async(settings: TenancySettings) -> None:
    from tenancy.sql.migrate import upgrade
    from tenancy.sql.session import make_engine

    _ensure_sqlite_dir(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


def _migrate(args: argparse.Namespace) -> int:
    settings = _settings(args.dir)
    if settings is None:
        return 2
    asyncio.run(_migrate_async(settings))
    return 0


async def _bootstrap_async(settings: TenancySettings, force: bool) -> str:
    from tenancy.auth.bootstrap import bootstrap_admin
    from tenancy.auth.key_format import KeyMinter
    from tenancy.sql.session import make_engine, make_sessionmaker

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
    from tenancy.errors import ClientError

    settings = _settings(args.dir)
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

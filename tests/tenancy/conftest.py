"""Real Redis and PostgreSQL for the tenancy tests (the gateway tests will reuse these fixtures).

REDIS_URL / DATABASE_URL point at existing servers when set; otherwise a private server is
started on a free loopback port for the session. Isolation: every test gets its own Redis key
prefix (only those keys are deleted afterwards) and its own PostgreSQL database.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncEngine

from tenancy.settings import TenancySettings
from tenancy.sql.migrate import upgrade
from tenancy.sql.session import make_engine

# --import-mode=importlib puts no test directory on sys.path; the helper module lives here.
sys.path.insert(0, str(Path(__file__).parent))
from admin_harness import Harness, admin_harness
from log_capture import captured_log_lines
from tenancy_factories import SecretRegistry


@pytest.fixture
def redis_url(redis_server_url: str) -> str:
    return redis_server_url


@pytest.fixture
async def aredis(redis_server_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server_url)
    yield client
    await client.aclose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'loragate.db'}"


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., TenancySettings]:
    def make(**overrides: Any) -> TenancySettings:
        values: dict[str, Any] = {
            "database_url": f"sqlite+aiosqlite:///{tmp_path / 'loragate.db'}",
            "key_pepper": secrets.token_urlsafe(32),
            "salt_secret": secrets.token_urlsafe(32),
            "adapter_store_dir": tmp_path / "adapters",
        }
        values.update(overrides)
        return TenancySettings(**values)

    return make


@pytest.fixture
async def migrated_engine(sqlite_url: str) -> AsyncIterator[AsyncEngine]:
    """The embedded default: a SQLite file migrated to head."""
    engine = make_engine(sqlite_url)
    await upgrade(engine)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="session")
def secret_registry() -> Iterator[SecretRegistry]:
    """Captures every log record of the tenancy run (DEBUG and up) and greps it at the end."""
    registry = SecretRegistry()
    with captured_log_lines() as lines:
        yield registry
    leaked = [v[:6] + "..." for v in registry.values if any(v in line for line in lines)]
    assert not leaked, f"secrets found in log records: {leaked}"


@pytest.fixture(autouse=True)
def _secret_log_guard(secret_registry: SecretRegistry) -> SecretRegistry:
    return secret_registry


@pytest.fixture
async def h(
    make_settings: Callable[..., TenancySettings], secret_registry: SecretRegistry
) -> AsyncIterator[Harness]:
    """The admin routers over a real runtime (SQLite file), with a bootstrap admin key."""
    async with admin_harness(make_settings()) as harness:
        secret_registry.add(harness.admin_key)
        yield harness

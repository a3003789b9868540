"""Chaos fixtures: real deployments (gateway processes, engines, Redis, PostgreSQL) and real,
impolite clients. Each test module gets a fresh PostgreSQL database and its own Redis prefix.

Run with `pytest tests/chaos` (or `make test-chaos`).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

# --import-mode=importlib puts no test directory on sys.path; the helper modules live here and
# beside the e2e and gateway tests.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "e2e"))
sys.path.insert(0, str(Path(__file__).parent.parent / "gateway"))
from services import create_database, drop_database


@pytest_asyncio.fixture
async def database_url(postgres_server_url: str) -> AsyncIterator[str]:
    """A fresh PostgreSQL database for the deployment under test, dropped afterwards."""
    url = await create_database(postgres_server_url)
    yield url
    await drop_database(postgres_server_url, url)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path

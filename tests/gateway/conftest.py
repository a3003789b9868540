"""Gateway test fixtures: one real gateway (tiny model, SQLite) per test module."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

# --import-mode=importlib puts no test directory on sys.path; the helper modules live here.
sys.path.insert(0, str(Path(__file__).parent))
from gateway_harness import Gateway, gateway_settings, running_gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    settings = gateway_settings(tiny_model_dir, tmp_path_factory.mktemp("gateway"))
    async with running_gateway(settings) as gw:
        yield gw

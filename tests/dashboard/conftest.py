"""Dashboard tests: the real app (tiny model, SQLite, in-process quota store) through the gateway
test harness, and a scan of every log record of the run for keys, salts and prompts."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "gateway"))
from gateway_harness import Gateway, SecretScan, gateway_settings, running_gateway
from log_capture import captured_log_lines


@pytest.fixture(scope="session")
def secret_scan() -> Iterator[SecretScan]:
    scan = SecretScan()
    with captured_log_lines() as lines:
        yield scan
    leaked = scan.leaked(lines)
    assert not leaked, f"secrets or prompts found in log records: {leaked}"


@pytest.fixture(autouse=True)
def _log_guard(secret_scan: SecretScan) -> SecretScan:
    return secret_scan


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, secret_scan: SecretScan
) -> AsyncIterator[Gateway]:
    settings = gateway_settings(tiny_model_dir, tmp_path_factory.mktemp("dashboard"))
    async with running_gateway(settings, secret_scan) as gw:
        yield gw


@pytest_asyncio.fixture(loop_scope="module")
async def browser(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    """A client of its own (its own cookie jar), like one browser, on the module's gateway."""
    transport = gateway.client._transport
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client

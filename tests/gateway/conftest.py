"""Gateway test fixtures: one real gateway (tiny model, SQLite) per test module, and a scan of
every log record of the run for keys, salts and prompt texts (SECURITY.md)."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

# --import-mode=importlib puts no test directory on sys.path; the helper modules live here.
sys.path.insert(0, str(Path(__file__).parent))
from gateway_harness import Gateway, SecretScan, gateway_settings, running_gateway


class _CaptureAll(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is still scanned by its raw parts
            text = f"{record.msg!r} {record.args!r}"
        self.lines.append(f"{text} {record.exc_text or ''}")


@pytest.fixture(scope="session")
def secret_scan() -> Iterator[SecretScan]:
    """Captures every log record of the gateway tests (DEBUG and up) and scans it at the end."""
    scan = SecretScan()
    handler = _CaptureAll()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield scan
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    leaked = scan.leaked(handler.lines)
    assert not leaked, f"secrets or prompts found in log records: {leaked}"


@pytest.fixture(autouse=True)
def _log_guard(secret_scan: SecretScan) -> SecretScan:
    return secret_scan


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, secret_scan: SecretScan
) -> AsyncIterator[Gateway]:
    settings = gateway_settings(tiny_model_dir, tmp_path_factory.mktemp("gateway"))
    async with running_gateway(settings, secret_scan) as gw:
        yield gw

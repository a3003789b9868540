"""End-to-end fixtures: a real gateway process over the real engine on the tiny model."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gateway_process import GatewayProcess, gateway_env, start_gateway


@pytest.fixture(scope="session")
def gateway_proc(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("e2e-gateway")
    gateway = start_gateway(gateway_env(tiny_model_dir, workdir), workdir)
    try:
        yield gateway
    finally:
        gateway.stop()
    # SECURITY.md: no key and no salt ever reaches the process's log.
    leaked = gateway.leaked_secrets()
    assert not leaked, f"secrets in the gateway log: {leaked}"

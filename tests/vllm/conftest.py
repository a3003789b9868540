"""The gateway on real vLLM servers: `loragate serve` processes over `vllm serve --tokens-only`."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
sys.path.insert(0, str(Path(__file__).parent))
from gateway_process import GatewayProcess, start_gateway
from vllm_gateway import vllm_gateway_env
from vllm_servers import VllmServer


@pytest.fixture(scope="module")
def vllm_gateway(
    vllm_servers: list[VllmServer], tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, Path]]:
    """One gateway (one worker) over both vLLM servers; (process, its work directory)."""
    workdir = tmp_path_factory.mktemp("gw-vllm")
    gateway = start_gateway(vllm_gateway_env(tiny_model_dir, workdir, vllm_servers), workdir)
    try:
        yield gateway, workdir
    finally:
        gateway.stop()
    assert not gateway.leaked_secrets()

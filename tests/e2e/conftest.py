"""End-to-end fixtures: a real gateway process on the tiny model, over each kind of engine the
gateway drives: the embedded engine (`make run`), two `loragate engine` servers behind the Redis
quota store (the distributed compose file's path), and two `vllm serve --tokens-only` servers
(marked `vllm`: `make test-vllm`)."""

from __future__ import annotations

import json
import os
import secrets
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "gateway"))  # engine_processes
# The dashboard's browser fixtures are here so that every dashboard test module shares one world.
from dashboard_world import chromium, driver, world  # noqa: F401
from gateway_process import GatewayProcess, gateway_env, start_gateway
from server_process import free_port

ENGINE_KINDS = ["embedded", "loragate-http", pytest.param("vllm", marks=pytest.mark.vllm)]


def _engine_env(
    kind: str, request: pytest.FixtureRequest, workdir: Path, gateway_port: int
) -> dict[str, str]:
    """The gateway's engine settings for `kind`, starting (and finalizing) its engines. The
    loragate engines fetch adapters from the gateway (on `gateway_port`, once it runs) with the
    engine token, in working directories of their own; vLLM loads from the directory store."""
    extra: dict[str, str] = {}
    if kind == "embedded":
        return {}
    if kind == "loragate-http":
        from engine_processes import start_engines

        token = secrets.token_urlsafe(32)
        extra["LORAGATE_ENGINE_ADMIN_TOKEN"] = token
        engines = start_engines(
            request.getfixturevalue("tiny_model_dir"), workdir, 2,
            "--adapter-source", f"http://127.0.0.1:{gateway_port}",
            env={**os.environ, "LORAGATE_ENGINE_ADMIN_TOKEN": token}, own_cwd=True,
        )  # fmt: skip
        for engine in engines:
            request.addfinalizer(engine.kill)
        urls = [e.url for e in engines]
        kind_name = "loragate"
    else:
        urls = [s.url for s in request.getfixturevalue("vllm_servers")]
        kind_name = "vllm"
        extra["LORAGATE_ADAPTER_STORE"] = "directory"
        # The second vLLM server runs with --max-num-seqs 1 (vllm_servers.py), which refuses
        # n=2; cache-aware routing's hashed home replica may be that one, least loaded is not
        # while the first is idle (as tests/vllm/vllm_gateway.py).
        extra["LORAGATE_ENGINE_ROUTING"] = "least_loaded"
    return {
        **extra,
        "LORAGATE_ENGINE_MODE": "http",
        "LORAGATE_ENGINE_KIND": kind_name,
        "LORAGATE_ENGINE_URLS": json.dumps(urls),
        "LORAGATE_ENGINE_POLL_INTERVAL_S": "0.3",
        "LORAGATE_QUOTA_STORE": "redis",
        "LORAGATE_REDIS_URL": request.getfixturevalue("redis_server_url"),
        "LORAGATE_REDIS_KEY_PREFIX": f"lgtest:e2e:{uuid.uuid4().hex[:12]}:",
    }


@pytest.fixture(scope="session", params=ENGINE_KINDS)
def gateway_proc(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp(f"e2e-gateway-{request.param}")
    port = free_port()
    engines = _engine_env(request.param, request, workdir, port)
    env = gateway_env(tiny_model_dir, workdir, **engines)
    gateway = start_gateway(env, workdir, port=port)
    try:
        yield gateway
    finally:
        gateway.stop()
    # SECURITY.md: no key and no salt ever reaches the process's log.
    leaked = gateway.leaked_secrets()
    assert not leaked, f"secrets in the gateway log: {leaked}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The world's acme is at its requests-per-minute limit only for the 60 s its sliding window
    holds the world's requests, and test_dashboard_browser.py reads that number: its tests run
    first among the tests that share the world, so the other modules' browser work (minutes on a
    slow machine) cannot empty the window before they look at it."""
    uses_world = [i for i in items if "world" in getattr(i, "fixturenames", ())]
    readers = [i for i in uses_world if i.path.name == "test_dashboard_browser.py"]
    if not readers or uses_world[0] in readers:
        return
    at = items.index(uses_world[0])
    rest = [i for i in items if i not in readers]
    items[:] = rest[:at] + readers + rest[at:]

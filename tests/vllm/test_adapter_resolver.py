"""Issue 44, acceptance 1 on vLLM: two gateway processes (PostgreSQL, Redis, the database
adapter store) and two real vLLM servers, each in a directory of its own, with loragate's LoRA
resolver plugin (lora/remote/vllm_plugin.py, installed by `make vllm-venv`). An adapter uploaded
through gateway 1 is served by server A (behind gateway 1, fetching from gateway 2) and server
B (behind gateway 2, fetching from gateway 1): each fetched it once, its hash checked (the
server's log and its cache say so), with PEFT's greedy tokens. Bytes cut short in the store
are refused: the request fails with "The adapter could not be loaded", nothing is loaded, and
the server goes on serving."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from adapter_fleet import (
    PROMPTS,
    Gateways,
    cache_entries,
    cut_blob_short,
    generate,
    peft_tokens,
    start_gateways,
)
from server_process import free_port
from vllm_servers import VllmServer, require_vllm, start_vllm

from gateway.demo.adapters import write_demo_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.postgres, pytest.mark.redis, pytest.mark.asyncio]


@pytest.fixture
def fleet(
    tiny_model_dir: Path, tmp_path: Path, postgres_url: str, redis_server_url: str
) -> Iterator[tuple[Gateways, list[VllmServer]]]:
    require_vllm()
    token = secrets.token_urlsafe(32)
    ports = [free_port(), free_port()]
    servers = start_vllm(
        tiny_model_dir, tmp_path, 2, own_cwd=True,
        env_for=lambda i: {
            "LORAGATE_ADAPTER_SOURCE": f"http://127.0.0.1:{ports[1 - i]}",
            "LORAGATE_ENGINE_ADMIN_TOKEN": token,
            "LORAGATE_ADAPTER_CACHE_DIR": "cache",  # in the server's own directory
            "LORAGATE_ADAPTER_CACHE_GB": "0.01",
        },
    )  # fmt: skip
    try:
        gateways = start_gateways(
            tiny_model_dir, tmp_path, ports=ports, engine_urls=[[s.url] for s in servers],
            token=token, database_url=postgres_url, redis_url=redis_server_url,
            LORAGATE_ENGINE_KIND="vllm",
        )  # fmt: skip
        try:
            yield gateways, servers
        finally:
            gateways.stop()
    finally:
        for server in servers:
            server.stop()
    for server in servers:
        assert token not in server.log_path.read_text(errors="replace")


async def test_vllm_servers_fetch_an_uploaded_adapter_through_the_resolver(
    fleet: tuple[Gateways, list[VllmServer]], tiny_model_dir: Path, tmp_path: Path,
    postgres_url: str,
) -> None:  # fmt: skip
    gateways, servers = fleet
    first, second = gateways.processes
    tenant = first.tenant()
    adapter_dir = write_demo_adapter(tmp_path / "upload", tiny_model_dir, name="tiny", seed=46)
    files = [(p.name, p.read_bytes()) for p in sorted(adapter_dir.iterdir())]
    adapter_id = first.upload_adapter(tenant.tenant_id, "fleet-lora", files)
    sha = first.admin("GET", f"/tenants/{tenant.tenant_id}/adapters/{adapter_id}").json()["sha256"]

    expected = peft_tokens(tiny_model_dir, adapter_dir)
    for gateway in (first, second):
        for _ in range(2):
            for prompt, tokens in zip(PROMPTS, expected, strict=True):
                r = generate(gateway, tenant.key, "fleet-lora", prompt)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["token_ids"] == tokens  # PEFT parity
    for server in servers:
        log = server.log_path.read_text(errors="replace")
        assert log.count(f"fetched adapter {adapter_id} (sha256 {sha[:16]}") == 1, log[-3000:]
        assert cache_entries(server.log_path.with_suffix("") / "cache") == [sha]

    other_dir = write_demo_adapter(tmp_path / "other", tiny_model_dir, name="tiny", seed=47)
    other = [(p.name, p.read_bytes()) for p in sorted(other_dir.iterdir())]
    other_id = second.upload_adapter(tenant.tenant_id, "cut-lora", other)
    listed = second.admin("GET", f"/tenants/{tenant.tenant_id}/adapters/{other_id}").json()
    await cut_blob_short(postgres_url, listed["sha256"])
    r = generate(first, tenant.key, "cut-lora", PROMPTS[0])
    # vLLM's resolver refused it: the loragate engine's error, not a bare "engine failed".
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("The adapter could not be loaded:") and other_id in message, message
    log = servers[0].log_path.read_text(errors="replace")
    assert f"loragate adapter {other_id} refused" in log and "truncated" in log
    assert cache_entries(servers[0].log_path.with_suffix("") / "cache") == [sha]
    # A refused load leaves the server serving.
    r = generate(first, tenant.key, "fleet-lora", PROMPTS[0])
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == expected[0], r.text

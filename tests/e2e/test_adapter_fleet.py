"""Issue 44, acceptance 1: adapters reach every engine without a shared volume.

Two gateway processes on one PostgreSQL database and one Redis, two `loragate engine` servers,
each process in a working directory of its own (nothing on disk is shared: the gateways use the
database store, each engine its own cache). An adapter uploaded through gateway 1 is served by
engine A (behind gateway 1, fetching from gateway 2, which never saw the upload) and by engine
B (behind gateway 2, fetching from gateway 1): each fetched it once, hash checked (its
metrics and its log say so), and both give PEFT's greedy tokens. An engine asked for a hash its
bytes do not have, or handed a bundle cut short, refuses it: the request fails with a clear 502
and nothing is loaded.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from adapter_fleet import (
    PROMPTS,
    cache_entries,
    cut_blob_short,
    generate,
    peft_tokens,
    start_gateways,
)
from engine_processes import EngineProcess, start_engines
from gateway_process import GatewayProcess
from server_process import free_port

from gateway.demo.adapters import write_demo_adapter

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.asyncio]


@dataclass
class Fleet:
    gateways: list[GatewayProcess]
    engines: list[EngineProcess]
    token: str = field(repr=False)


@pytest.fixture
def fleet(
    tiny_model_dir: Path, tmp_path: Path, postgres_url: str, redis_server_url: str
) -> Iterator[Fleet]:
    token = secrets.token_urlsafe(32)
    ports = [free_port(), free_port()]
    # Engine A fetches from gateway 2, engine B from gateway 1: neither from the replica the
    # upload went through, so each fetch proves the bytes came from the shared database.
    engines = start_engines(
        tiny_model_dir, tmp_path, 2,
        env={**os.environ, "LORAGATE_ENGINE_ADMIN_TOKEN": token}, own_cwd=True,
        per_engine=lambda i: ["--adapter-source", f"http://127.0.0.1:{ports[1 - i]}",
                              "--adapter-cache-dir", "cache", "--adapter-cache-gb", "0.01"],
    )  # fmt: skip
    try:
        gateways = start_gateways(
            tiny_model_dir, tmp_path, ports=ports, engine_urls=[[e.url] for e in engines],
            token=token, database_url=postgres_url, redis_url=redis_server_url,
        )  # fmt: skip
        try:
            yield Fleet(gateways.processes, engines, token)
        finally:
            gateways.stop()
    finally:
        for engine in engines:
            engine.kill()
    for engine in engines:
        assert token not in engine.log_path.read_text(errors="replace")


async def test_an_uploaded_adapter_reaches_both_engines_without_a_shared_volume(
    fleet: Fleet, tiny_model_dir: Path, tmp_path: Path, postgres_url: str
) -> None:
    first, second = fleet.gateways
    tenant = first.tenant()
    adapter_dir = write_demo_adapter(tmp_path / "upload", tiny_model_dir, name="tiny", seed=44)
    files = [(p.name, p.read_bytes()) for p in sorted(adapter_dir.iterdir())]
    adapter_id = first.upload_adapter(tenant.tenant_id, "fleet-lora", files)

    expected = peft_tokens(tiny_model_dir, adapter_dir)
    for gateway in (first, second):
        for _ in range(2):  # the second round is served from each engine's cache
            for prompt, tokens in zip(PROMPTS, expected, strict=True):
                r = generate(gateway, tenant.key, "fleet-lora", prompt)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["token_ids"] == tokens  # PEFT parity
    sha = first.admin("GET", f"/tenants/{tenant.tenant_id}/adapters/{adapter_id}").json()["sha256"]
    for engine in fleet.engines:
        assert engine.metric("loragate_engine_adapter_fetches_total") == 1  # once each
        assert engine.metric("loragate_engine_adapter_fetch_refusals_total") == 0
        log = engine.log_path.read_text(errors="replace")
        assert log.count(f"fetched adapter {adapter_id} (sha256 {sha[:16]}") == 1
        assert "hash checked" in log
        cache = engine.log_path.with_suffix("") / "cache"  # in the engine's own directory
        assert cache_entries(cache) == [sha]

    # An engine asked for a hash its bytes do not have refuses them and loads nothing.
    other_dir = write_demo_adapter(tmp_path / "other", tiny_model_dir, name="tiny", seed=45)
    other = [(p.name, p.read_bytes()) for p in sorted(other_dir.iterdir())]
    other_id = second.upload_adapter(tenant.tenant_id, "cut-lora", other)
    engine = fleet.engines[0]
    r = httpx.post(
        engine.url + "/v1/load_lora_adapter",
        json={"lora_name": other_id, "lora_sha256": "0" * 64},
        headers={"authorization": f"Bearer {fleet.token}"}, timeout=60,
    )  # fmt: skip
    assert r.status_code == 502 and "0" * 64 in r.json()["error"]["message"], r.text
    assert engine.metric("loragate_engine_adapter_fetch_refusals_total") == 1

    # The stored bytes cut short: the engine that fetches them refuses, the request fails.
    listed = second.admin("GET", f"/tenants/{tenant.tenant_id}/adapters/{other_id}").json()
    await cut_blob_short(postgres_url, listed["sha256"])
    r = generate(first, tenant.key, "cut-lora", PROMPTS[0])
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("The adapter could not be loaded") and "refused" in message
    assert engine.metric("loragate_engine_adapter_fetch_refusals_total") == 2
    assert engine.metric("loragate_engine_adapter_fetches_total") == 1
    r = generate(first, tenant.key, "fleet-lora", PROMPTS[0])  # the good one still serves
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == expected[0]

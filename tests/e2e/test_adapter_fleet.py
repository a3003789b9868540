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

import json
import os
import secrets
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from engine_processes import EngineProcess, start_engines
from gateway_process import BIN, GatewayProcess, bootstrap_admin, gateway_env
from server_process import free_port, start_logged, wait_healthy
from services import delete_redis_keys
from sqlalchemy import select

from gateway.demo.adapters import write_demo_adapter
from tenancy.sql.models import AdapterBlob
from tenancy.sql.session import make_engine, make_sessionmaker
from tests.lora.peft_builders import load_base

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.asyncio]

PROMPTS = [[5, 17, 42, 99, 3], [7, 7, 8, 9, 200, 31, 64, 2, 11]]
MAX_TOKENS = 8


def _launch(env: dict[str, str], cwd: Path, port: int, admin_key: str) -> GatewayProcess:
    """One `loragate serve` on `port` in `cwd` (the database already has its admin)."""
    log_path = cwd / f"gateway-{port}.log"
    proc = start_logged(
        [str(BIN / "loragate"), "serve", "--host", "127.0.0.1", "--port", str(port)],
        log_path, env=env, cwd=cwd,
    )  # fmt: skip
    gateway = GatewayProcess(
        url=f"http://127.0.0.1:{port}", admin_key=admin_key, log_path=log_path, proc=proc,
        salt_secret=env["LORAGATE_SALT_SECRET"],
    )  # fmt: skip
    gateway.secrets.append(admin_key)
    return gateway


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
    prefix = f"lgtest:fleet:{uuid.uuid4().hex[:12]}:"
    gateways: list[GatewayProcess] = []
    try:
        base = gateway_env(
            tiny_model_dir, tmp_path,
            LORAGATE_DATABASE_URL=postgres_url, LORAGATE_QUOTA_STORE="redis",
            LORAGATE_REDIS_URL=redis_server_url, LORAGATE_REDIS_KEY_PREFIX=prefix,
            LORAGATE_ENGINE_MODE="http", LORAGATE_ENGINE_ADMIN_TOKEN=token,
            LORAGATE_ENGINE_POLL_INTERVAL_S="0.3",
        )  # fmt: skip
        admin_key = bootstrap_admin(base)
        for i, (port, engine) in enumerate(zip(ports, engines, strict=True)):
            cwd = tmp_path / f"gateway-{i + 1}"
            cwd.mkdir()
            env = {
                **base,
                "LORAGATE_ENGINE_URLS": json.dumps([engine.url]),
                "LORAGATE_ADAPTER_STORE_DIR": str(cwd / "adapters"),  # unused: the database
            }
            gateways.append(_launch(env, cwd, port, admin_key))
        for gateway in gateways:
            wait_healthy(gateway.url + "/ready", gateway.proc, gateway.log_path, timeout_s=120)
        yield Fleet(gateways, engines, token)
    finally:
        for gateway in gateways:
            gateway.stop()
        for engine in engines:
            engine.kill()
        delete_redis_keys(redis_server_url, prefix)
    for gateway in gateways:
        assert not gateway.leaked_secrets(), gateway.leaked_secrets()
        assert token not in gateway.log_text()
    for engine in engines:
        assert token not in engine.log_path.read_text(errors="replace")


def _generate(gateway: GatewayProcess, key: str, model: str, prompt: list[int]) -> Any:
    body = {
        "model": model, "token_ids": prompt,
        "sampling_params": {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
    }  # fmt: skip
    return httpx.post(
        gateway.url + "/inference/v1/generate", json=body,
        headers={"authorization": f"Bearer {key}"}, timeout=120,
    )  # fmt: skip


def _metric(engine: EngineProcess, name: str) -> float:
    """A label-less series of the engine's /metrics."""
    for line in httpx.get(engine.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not on the engine's /metrics")


def _peft_tokens(model_dir: Path, adapter_dir: Path) -> list[list[int]]:
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model: Any = PeftModel.from_pretrained(load_base(model_dir), str(adapter_dir)).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            generated = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=MAX_TOKENS,
            )  # fmt: skip
            out.append(generated[0, len(prompt) :].tolist())
    return out


async def _corrupt_blob(database_url: str, sha256: str) -> None:
    engine = make_engine(database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            blob = (
                await session.scalars(select(AdapterBlob).where(AdapterBlob.sha256 == sha256))
            ).one()
            assert blob.data is not None
            blob.data = blob.data[: len(blob.data) // 2]  # the stored bytes cut short
            await session.commit()
    finally:
        await engine.dispose()


async def test_an_uploaded_adapter_reaches_both_engines_without_a_shared_volume(
    fleet: Fleet, tiny_model_dir: Path, tmp_path: Path, postgres_url: str
) -> None:
    first, second = fleet.gateways
    tenant = first.tenant()
    adapter_dir = write_demo_adapter(tmp_path / "upload", tiny_model_dir, name="tiny", seed=44)
    files = [(p.name, p.read_bytes()) for p in sorted(adapter_dir.iterdir())]
    adapter_id = first.upload_adapter(tenant.tenant_id, "fleet-lora", files)

    expected = _peft_tokens(tiny_model_dir, adapter_dir)
    for gateway in (first, second):
        for _ in range(2):  # the second round is served from each engine's cache
            for prompt, tokens in zip(PROMPTS, expected, strict=True):
                r = _generate(gateway, tenant.key, "fleet-lora", prompt)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["token_ids"] == tokens  # PEFT parity
    sha = first.admin("GET", f"/tenants/{tenant.tenant_id}/adapters/{adapter_id}").json()["sha256"]
    for engine in fleet.engines:
        assert _metric(engine, "loragate:adapter_fetches_total") == 1  # once each
        assert _metric(engine, "loragate:adapter_fetch_refusals_total") == 0
        log = engine.log_path.read_text(errors="replace")
        assert log.count(f"fetched adapter {adapter_id} (sha256 {sha[:16]}") == 1
        assert "hash checked" in log
        cache = engine.log_path.with_suffix("") / "cache"  # in the engine's own directory
        assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [sha]

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
    assert _metric(engine, "loragate:adapter_fetch_refusals_total") == 1

    # The stored bytes cut short: the engine that fetches them refuses, the request fails.
    listed = second.admin("GET", f"/tenants/{tenant.tenant_id}/adapters/{other_id}").json()
    await _corrupt_blob(postgres_url, listed["sha256"])
    r = _generate(first, tenant.key, "cut-lora", PROMPTS[0])
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("The adapter could not be loaded") and "refused" in message
    assert _metric(engine, "loragate:adapter_fetch_refusals_total") == 2
    assert _metric(engine, "loragate:adapter_fetches_total") == 1
    r = _generate(first, tenant.key, "fleet-lora", PROMPTS[0])  # the good one still serves
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == expected[0]

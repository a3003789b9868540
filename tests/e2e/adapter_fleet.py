"""A fleet without a shared volume (issue 44, acceptance 1), for tests/e2e/test_adapter_fleet.py
(loragate engines) and tests/vllm/test_adapter_resolver.py (vLLM): gateway processes on one
PostgreSQL database and one Redis, each in a working directory of its own; engines started by
the test, each fetching adapters from a gateway with the engine token into its own cache.
Also the checks both share: greedy tokens through the gateway, PEFT's, a store's bytes cut short.
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
from gateway_process import BIN, GatewayProcess, bootstrap_admin, gateway_env
from server_process import start_logged, wait_healthy
from services import delete_redis_keys
from sqlalchemy import select

from tenancy.sql.models import AdapterBlob
from tenancy.sql.session import make_engine, make_sessionmaker
from tests.lora.peft_builders import load_base

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
class Gateways:
    processes: list[GatewayProcess]
    token: str = field(repr=False)
    redis_url: str
    prefix: str

    def stop(self) -> None:
        for gateway in self.processes:
            gateway.stop()
        delete_redis_keys(self.redis_url, self.prefix)
        for gateway in self.processes:
            assert not gateway.leaked_secrets(), gateway.leaked_secrets()
            assert self.token not in gateway.log_text()


def start_gateways(
    model_dir: Path,
    workdir: Path,
    *,
    ports: Sequence[int],
    engine_urls: Sequence[Sequence[str]],
    token: str,
    database_url: str,
    redis_url: str,
    **extra: str,
) -> Gateways:
    """Gateway i on ports[i] over engine_urls[i], in workdir/gateway-<i+1>, all on one database
    (the database adapter store) and one Redis."""
    prefix = f"lgtest:fleet:{uuid.uuid4().hex[:12]}:"
    base = gateway_env(
        model_dir, workdir,
        LORAGATE_DATABASE_URL=database_url, LORAGATE_QUOTA_STORE="redis",
        LORAGATE_REDIS_URL=redis_url, LORAGATE_REDIS_KEY_PREFIX=prefix,
        LORAGATE_ENGINE_MODE="http", LORAGATE_ENGINE_ADMIN_TOKEN=token,
        LORAGATE_ENGINE_POLL_INTERVAL_S="0.3", LORAGATE_ADAPTER_STORE="database", **extra,
    )  # fmt: skip
    admin_key = bootstrap_admin(base)
    gateways = Gateways([], token, redis_url, prefix)
    try:
        for i, (port, urls) in enumerate(zip(ports, engine_urls, strict=True)):
            cwd = workdir / f"gateway-{i + 1}"
            cwd.mkdir()
            env = {
                **base,
                "LORAGATE_ENGINE_URLS": json.dumps(list(urls)),
                "LORAGATE_ADAPTER_STORE_DIR": str(cwd / "adapters"),  # unused: the database
            }
            gateways.processes.append(_launch(env, cwd, port, admin_key))
        for gateway in gateways.processes:
            wait_healthy(gateway.url + "/ready", gateway.proc, gateway.log_path, timeout_s=120)
    except BaseException:
        gateways.stop()
        raise
    return gateways


def generate(gateway: GatewayProcess, key: str, model: str, prompt: list[int]) -> Any:
    body = {
        "model": model, "token_ids": prompt,
        "sampling_params": {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
    }  # fmt: skip
    return httpx.post(
        gateway.url + "/inference/v1/generate", json=body,
        headers={"authorization": f"Bearer {key}"}, timeout=120,
    )  # fmt: skip


def peft_tokens(model_dir: Path, adapter_dir: Path) -> list[list[int]]:
    """PEFT's greedy continuation of each of PROMPTS (fp32, no end of sequence)."""
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


async def cut_blob_short(database_url: str, sha256: str) -> None:
    """Halve a blob's stored bytes (its row keeps the full size and the hash)."""
    engine = make_engine(database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            blob = (
                await session.scalars(select(AdapterBlob).where(AdapterBlob.sha256 == sha256))
            ).one()
            assert blob.data is not None
            blob.data = blob.data[: len(blob.data) // 2]
            await session.commit()
    finally:
        await engine.dispose()


def cache_entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))

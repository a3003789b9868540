"""Helpers for the gateway on real vLLM servers: gateway settings, the OpenAI SDK client and a
chat call, polling, the usage ledger's rows."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from gateway_process import BIN, STARTUP_TIMEOUT_S, GatewayProcess, free_port, gateway_env
from openai import OpenAI
from vllm_servers import VllmServer

MODEL = "tiny"  # the name the vLLM servers serve the tiny model under


def sdk(gateway: GatewayProcess, key: str) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=key, timeout=120, max_retries=0)


def chat(client: OpenAI, content: str, **kw: object) -> object:
    return client.chat.completions.create(
        model=kw.pop("model", MODEL),  # type: ignore[arg-type]
        messages=[{"role": "user", "content": content}],
        **kw,  # type: ignore[arg-type]
    )


def until(condition: Callable[[], bool], timeout_s: float = 10, every_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


def vllm_gateway_env(
    model_dir: Path, workdir: Path, servers: list[VllmServer], **extra: str
) -> dict[str, str]:
    settings = {
        "LORAGATE_ENGINE_MODE": "http",
        "LORAGATE_ENGINE_KIND": "vllm",
        "LORAGATE_ENGINE_URLS": json.dumps([s.url for s in servers]),
        "LORAGATE_ENGINE_POLL_INTERVAL_S": "0.3",
        # vLLM loads from the directory store's paths here (one machine); tests/vllm/
        # test_adapter_resolver.py fetches from the database store through the plugin.
        "LORAGATE_ADAPTER_STORE": "directory",
        # Replica 1 runs with --max-num-seqs 1 (vllm_servers.py): these tests expect the
        # index-ordered choice, not cache-aware routing's hashed home replica.
        "LORAGATE_ENGINE_ROUTING": "least_loaded",
    }
    return gateway_env(model_dir, workdir, **{**settings, **extra})


def usage_rows(workdir: Path, tenant_id: str) -> list[sqlite3.Row]:
    """The ledger's rows for a tenant, read from the gateway's own database file."""
    db = sqlite3.connect(workdir / "gateway.db")
    db.row_factory = sqlite3.Row
    try:
        return db.execute(
            "SELECT * FROM usage_records WHERE tenant_id = ? ORDER BY started_at", (tenant_id,)
        ).fetchall()
    finally:
        db.close()


def restart_gateway(gateway: GatewayProcess, env: dict[str, str], workdir: Path) -> GatewayProcess:
    """The same gateway (database, adapters, admin key) started again after `stop()`: no
    bootstrap, which would refuse a database that has its admin already."""
    port = free_port()
    log_path = workdir / f"gateway-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(BIN / "loragate"), "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    restarted = dataclasses.replace(gateway, url=f"http://127.0.0.1:{port}", proc=proc,
                                    log_path=log_path)  # fmt: skip
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited early:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(restarted.url + "/ready", timeout=2).status_code == 200:
                return restarted
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    restarted.stop()
    raise RuntimeError("gateway did not become ready")

"""LiteLLM's proxy as bench/gateway_overhead.py's peer: one worker on the same engine stand-in
(its OpenAI chat route), with a master key, and a second one that also keeps its rate-limit
counters in Redis (router_settings), as a multi-replica LiteLLM deployment would.

The proxy runs from its own venv (`make litellm-venv`, .cache/litellm-venv), never ours.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from gateway_processes import Processes, free_port

ROOT = Path(__file__).resolve().parents[1]
LITELLM = ROOT / ".cache/litellm-venv/bin/litellm"
STARTUP_TIMEOUT_S = 180.0  # the proxy imports a great deal on a cold start


@dataclass(frozen=True)
class LiteLLM:
    url: str
    key: str  # the master key


def missing_reason() -> str | None:
    if LITELLM.exists():
        return None
    return f"no LiteLLM proxy at {LITELLM}: `make litellm-venv` builds it"


def _config(standin_url: str, master_key: str, redis_url: str | None) -> str:
    lines = [
        "model_list:",
        "  - model_name: tiny",
        "    litellm_params:",
        "      model: openai/tiny",
        f"      api_base: {standin_url}/v1",
        "      api_key: standin",
    ]
    if redis_url is not None:
        # Limits that never bind, so the router counts every request in Redis.
        lines += ["      rpm: 1000000000", "      tpm: 1000000000000"]
        redis = urlparse(redis_url)
        lines += [
            "router_settings:",
            f"  redis_host: {redis.hostname}",
            f"  redis_port: {redis.port}",
            "  routing_strategy: usage-based-routing-v2",
        ]
    lines += [
        "general_settings:",
        f"  master_key: {master_key}",
        "litellm_settings:",
        "  drop_params: true",
        "  set_verbose: false",
    ]
    return "\n".join(lines) + "\n"


def start_litellm(
    procs: Processes, name: str, standin_url: str, redis_url: str | None = None
) -> LiteLLM:
    master_key = "sk-" + secrets.token_urlsafe(24)
    config = procs.workdir / f"{name}.yaml"
    config.write_text(_config(standin_url, master_key, redis_url))
    config.chmod(0o600)
    port = free_port()
    proc = procs.start(
        name,
        [
            str(LITELLM),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        env={
            "PATH": str(LITELLM.parent) + ":/usr/bin:/bin",
            "LITELLM_LOG": "ERROR",
            "HOME": str(procs.workdir),
        },
    )
    url = f"http://127.0.0.1:{port}"
    procs.wait_ready(proc, url + "/health/liveliness", timeout_s=STARTUP_TIMEOUT_S)
    return LiteLLM(url, master_key)

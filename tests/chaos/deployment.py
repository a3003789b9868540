"""A real deployment on loopback for the chaos tests: `loragate serve` processes over a real
engine (in-process, or `loragate engine` servers over HTTP), a Redis quota store and a
PostgreSQL usage ledger, set up through the CLI and the admin REST API as an operator would.

The test reads the truth from the parts themselves: usage rows from PostgreSQL, leases from
Redis (through the same `RedisQuotaStore` the gateways admit with), engine state from the
engine's `/metrics`, and each process's log for tracebacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from engine_processes import EngineProcess
from gateway_process import BIN, GatewayProcess, TenantInfo, bootstrap_admin
from server_process import free_port, start_logged, wait_healthy
from services import delete_redis_keys
from sqlalchemy import select

from tenancy.quota.redis_store import RedisQuotaStore
from tenancy.quota.store import QuotaUsage
from tenancy.redis_client import make_redis
from tenancy.sql.models import UsageRecord
from tenancy.sql.session import make_engine, make_sessionmaker

STARTUP_TIMEOUT_S = 180.0
# What no log may hold after the clients' churn (issue: quiet logs under churn).
NOISE = ("Traceback", "Exception in ASGI application", "Future exception was never retrieved")


def deployment_env(
    model_dir: Path, workdir: Path, *, database_url: str, redis_url: str, **extra: str
) -> dict[str, str]:
    env = {
        **os.environ,
        "LORAGATE_MODEL": str(model_dir),
        "LORAGATE_SERVED_MODEL_NAME": "tiny",
        "LORAGATE_DATABASE_URL": database_url,
        "LORAGATE_QUOTA_STORE": "redis",
        "LORAGATE_REDIS_URL": redis_url,
        "LORAGATE_REDIS_KEY_PREFIX": f"lgchaos:{uuid.uuid4().hex[:12]}:",
        "LORAGATE_KEY_PEPPER": secrets.token_urlsafe(32),
        "LORAGATE_SALT_SECRET": secrets.token_urlsafe(32),
        "LORAGATE_ADAPTER_STORE_DIR": str(workdir / "adapters"),
        "LORAGATE_AUTO_MIGRATE": "true",
        "LORAGATE_ENGINE__NUM_KV_BLOCKS": "1024",
        "LORAGATE_ENGINE__MAX_NUM_SEQS": "64",
        "LORAGATE_USAGE_FLUSH_INTERVAL_S": "0.05",
        "LORAGATE_ENGINE_POLL_INTERVAL_S": "0.3",
    }
    env.update(extra)
    return env


def launch_gateway(
    env: dict[str, str], workdir: Path, admin_key: str, *args: str
) -> GatewayProcess:
    """Start one `loragate serve` (no bootstrap: the database already has its admin)."""
    port = free_port()
    log_path = workdir / f"gateway-{port}.log"
    proc = start_logged(
        [str(BIN / "loragate"), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
        log_path, env=env,
    )  # fmt: skip
    gateway = GatewayProcess(
        url=f"http://127.0.0.1:{port}",
        admin_key=admin_key,
        log_path=log_path,
        proc=proc,
        salt_secret=env["LORAGATE_SALT_SECRET"],
    )
    gateway.secrets.append(admin_key)
    return gateway


def wait_ready(gateway: GatewayProcess, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    wait_healthy(gateway.url + "/ready", gateway.proc, gateway.log_path, timeout_s=timeout_s)


@dataclass
class Deployment:
    env: dict[str, str] = field(repr=False)
    workdir: Path
    gateways: list[GatewayProcess]
    engines: list[EngineProcess]
    admin_key: str = field(repr=False)

    @property
    def gateway(self) -> GatewayProcess:
        return self.gateways[0]

    @property
    def database_url(self) -> str:
        return self.env["LORAGATE_DATABASE_URL"]

    def tenant(self, *, tier: str = "standard", **limits: int) -> TenantInfo:
        return self.gateway.tenant(tier=tier, **limits)

    # ---- processes -----------------------------------------------------------------------------

    def start_gateway(self, *args: str, **extra_env: str) -> GatewayProcess:
        gateway = launch_gateway({**self.env, **extra_env}, self.workdir, self.admin_key, *args)
        self.gateways.append(gateway)
        wait_ready(gateway)
        return gateway

    def terminate(self, gateway: GatewayProcess) -> float:
        """SIGTERM; the seconds until the process exited."""
        started = time.monotonic()
        gateway.proc.send_signal(signal.SIGTERM)
        gateway.proc.wait(timeout=120)
        return time.monotonic() - started

    def stop(self) -> None:
        """Stop every process and delete this deployment's Redis keys."""
        for gateway in self.gateways:
            gateway.stop()
        for engine in self.engines:
            engine.kill()
        with contextlib.suppress(redis.RedisError):  # a test may have killed its Redis
            delete_redis_keys(self.env["LORAGATE_REDIS_URL"], self.env["LORAGATE_REDIS_KEY_PREFIX"])

    def noisy_logs(self) -> list[str]:
        """Lines of any gateway log that hold a traceback or an unretrieved future."""
        return [
            line
            for gateway in self.gateways
            for line in gateway.log_text().splitlines()
            if any(noise in line for noise in NOISE)
        ]

    # ---- the truth, from the parts themselves --------------------------------------------------

    async def rows(self, tenant_id: str) -> list[UsageRecord]:
        engine = make_engine(self.database_url)
        try:
            async with make_sessionmaker(engine)() as session:
                found = await session.scalars(
                    select(UsageRecord).where(UsageRecord.tenant_id == tenant_id)
                )
                return list(found.all())
        finally:
            await engine.dispose()

    async def wait_rows(
        self, tenant_id: str, count: int, timeout_s: float = 30.0
    ) -> list[UsageRecord]:
        """The tenant's rows once there are `count` (or the timeout: whatever is there)."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = await self.rows(tenant_id)
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            await asyncio.sleep(0.2)

    async def quota(self, tenant_id: str) -> QuotaUsage:
        client = make_redis(self.env["LORAGATE_REDIS_URL"])
        store = RedisQuotaStore(
            client, prefix=self.env["LORAGATE_REDIS_KEY_PREFIX"], lease_ttl_s=600
        )
        try:
            return await store.usage(f"t:{tenant_id}")
        finally:
            await store.close()

    def engine_metrics(self) -> dict[str, float]:
        """The engines' vLLM-named metrics, summed over replicas (in-process: the gateway's)."""
        urls = [e.url for e in self.engines] or [self.gateway.url]
        totals: dict[str, float] = {}
        for url in urls:
            for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
                if not line.startswith("vllm:"):
                    continue
                name = line.split("{", 1)[0].split(" ", 1)[0]
                totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return totals

    async def wait_engines_idle(self, timeout_s: float = 30.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout_s
        while True:
            metrics = self.engine_metrics()
            busy = metrics.get("vllm:num_requests_running", 0) + metrics.get(
                "vllm:num_requests_waiting", 0
            )
            if busy == 0 or time.monotonic() > deadline:
                return metrics
            await asyncio.sleep(0.2)


def deploy(
    model_dir: Path,
    workdir: Path,
    *,
    database_url: str,
    redis_url: str,
    num_gateways: int = 1,
    engines: list[EngineProcess] | None = None,
    serve_args: tuple[str, ...] = (),
    **extra_env: str,
) -> Deployment:
    """Migrate and bootstrap once, then start `num_gateways` gateways sharing everything."""
    if engines:
        extra_env.setdefault("LORAGATE_ENGINE_MODE", "http")
        extra_env.setdefault(
            "LORAGATE_ENGINE_URLS", "[" + ",".join(f'"{e.url}"' for e in engines) + "]"
        )
    env = deployment_env(
        model_dir, workdir, database_url=database_url, redis_url=redis_url, **extra_env
    )
    admin_key = bootstrap_admin(env)
    gateways = [launch_gateway(env, workdir, admin_key, *serve_args) for _ in range(num_gateways)]
    deployment = Deployment(
        env=env, workdir=workdir, gateways=gateways, engines=engines or [], admin_key=admin_key
    )
    try:
        for gateway in gateways:
            wait_ready(gateway)
    except BaseException:
        deployment.stop()
        raise
    return deployment


def sse_events(lines: list[str]) -> list[dict[str, Any]]:
    import json

    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]

"""A real gateway process (`loragate serve` under uvicorn on a free loopback port) for end-to-end
tests, set up through its own CLI and admin REST API, as an operator would."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from server_process import StartupError, free_port, start_logged, wait_healthy

BIN = Path(sys.executable).parent
STARTUP_TIMEOUT_S = 120.0


def gateway_env(model_dir: Path, workdir: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "LORAGATE_MODEL": str(model_dir),
        "LORAGATE_SERVED_MODEL_NAME": "tiny",
        "LORAGATE_DATABASE_URL": f"sqlite+aiosqlite:///{workdir / 'gateway.db'}",
        "LORAGATE_KEY_PEPPER": secrets.token_urlsafe(32),
        "LORAGATE_SALT_SECRET": secrets.token_urlsafe(32),
        "LORAGATE_ADAPTER_STORE_DIR": str(workdir / "adapters"),
        "LORAGATE_AUTO_MIGRATE": "true",
        "LORAGATE_ENGINE__NUM_KV_BLOCKS": "1024",
        "LORAGATE_USAGE_FLUSH_INTERVAL_S": "0.05",
    }
    env.update(extra)
    return env


@dataclass
class TenantInfo:
    tenant_id: str
    key: str = field(repr=False)


@dataclass
class GatewayProcess:
    url: str
    admin_key: str = field(repr=False)
    log_path: Path
    proc: subprocess.Popen[bytes]
    salt_secret: str = field(default="", repr=False)
    secrets: list[str] = field(default_factory=list, repr=False)
    tenant_ids: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {self.admin_key}", **kw.pop("headers", {})}
        return httpx.request(
            method, self.url + "/admin/v1" + path, headers=headers, timeout=30, **kw
        )

    def tenant(self, *, tier: str = "standard", **limits: int) -> TenantInfo:
        r = self.admin(
            "POST", "/tenants", json={"name": f"t-{uuid.uuid4().hex[:10]}", "tier": tier}
        )
        assert r.status_code == 201, r.text
        tenant_id = r.json()["id"]
        self.tenant_ids.append(tenant_id)
        r = self.admin("POST", f"/tenants/{tenant_id}/keys", json={"name": "k"})
        assert r.status_code == 201, r.text
        key = r.json()["key"]
        self.secrets.append(key)
        if limits:
            r = self.admin("PUT", f"/tenants/{tenant_id}/quotas", json=limits)
            assert r.status_code == 200, r.text
        return TenantInfo(tenant_id=tenant_id, key=key)

    def upload_adapter(self, tenant_id: str, name: str, files: list[tuple[str, bytes]]) -> str:
        """Through the admin REST API, as a tenant's operator would; returns the adapter id."""
        r = self.admin(
            "POST",
            f"/tenants/{tenant_id}/adapters",
            data={"name": name},
            files=[("files", (filename, data)) for filename, data in files],
        )
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def leaked_secrets(self) -> list[str]:
        """Keys and tenant cache salts found in the process's log (abbreviated)."""
        from tenancy.ids import TenantId
        from tenancy.salts import SaltDeriver

        deriver = SaltDeriver(self.salt_secret.encode())
        salts = [deriver.salt(TenantId(t), 0) for t in self.tenant_ids]
        log = self.log_text()
        return [s[:6] + "..." for s in [*self.secrets, *salts] if s in log]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def bootstrap_admin(env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(BIN / "loragate"), "admin", "bootstrap"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def start_gateway(
    env: dict[str, str], workdir: Path, *args: str, port: int | None = None
) -> GatewayProcess:
    """`port`: when the settings must name the gateway's own URL (an SSO callback)."""
    port = port or free_port()
    log_path = workdir / f"gateway-{port}.log"
    admin_key = bootstrap_admin(env)
    proc = start_logged(
        [str(BIN / "loragate"), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
        log_path,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    gateway = GatewayProcess(
        url=url,
        admin_key=admin_key,
        log_path=log_path,
        proc=proc,
        salt_secret=env["LORAGATE_SALT_SECRET"],
    )
    gateway.secrets.append(admin_key)
    try:
        wait_healthy(url + "/ready", proc, log_path, timeout_s=STARTUP_TIMEOUT_S)
    except StartupError:
        gateway.stop()
        raise
    return gateway

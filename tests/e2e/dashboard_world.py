"""The world the dashboard's browser tests run against: one `loragate serve` process with OIDC
pointed at a local identity provider, two tenants (acme, a realtime tenant at its requests-per-
minute limit; globex, a batch tenant) with keys, quotas and an adapter each, and traffic sent
through the OpenAI SDK that leaves known usage and rejections in the ledger and the quota store.

The fixtures are session-scoped and reach the test modules through tests/e2e/conftest.py, so
every dashboard test module reads the same world: starting and seeding the gateway is most of
their time. Only test_dashboard_browser.py adds traffic (one more rejection, which it counts).
`open_world` makes the same world on other settings, for a module of its own (several base
models: test_dashboard_several_models_browser.py).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from browser import find_chromium, start_chromium
from gateway_process import GatewayProcess, free_port, gateway_env, start_gateway
from local_idp import LocalIdp
from openai import OpenAI
from selenium import webdriver

from gateway.demo.adapters import demo_adapter_files
from tenancy.adapters.base_model import base_model_spec

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny"
CLIENT_ID = "loragate-dashboard"
RPM = 6
ACME_LIMITS: dict[str, int | None] = {
    "requests_per_minute": RPM, "tokens_per_minute": 20_000, "max_concurrent": 4,
    "daily_token_budget": 250_000, "monthly_token_budget": 3_000_000,
}  # fmt: skip
GLOBEX_LIMITS = {"requests_per_minute": 600, "tokens_per_minute": 100_000, "max_concurrent": 16,
                 "daily_token_budget": None, "monthly_token_budget": 10_000_000}  # fmt: skip


@dataclass
class Tenant:
    id: str
    name: str
    inference_key: str
    admin_key: str  # tenant-admin scope


@dataclass
class World:
    gateway: GatewayProcess
    idp: LocalIdp
    acme: Tenant
    globex: Tenant
    shots: Path
    pepper: str = ""  # the gateway's key pepper: a test may sign a session as the gateway does


def _tenant(gw: GatewayProcess, name: str, tier: str, limits: dict[str, int | None]) -> Tenant:
    r = gw.admin("POST", "/tenants", json={"name": name, "tier": tier})
    assert r.status_code == 201, r.text
    tenant_id = r.json()["id"]
    gw.tenant_ids.append(tenant_id)
    keys = []
    for key_name, scopes in (("app-server", ["inference"]), ("ops", ["tenant-admin"])):
        r = gw.admin(
            "POST", f"/tenants/{tenant_id}/keys", json={"name": key_name, "scopes": scopes}
        )
        assert r.status_code == 201, r.text
        keys.append(r.json()["key"])
        gw.secrets.append(keys[-1])
    assert gw.admin("PUT", f"/tenants/{tenant_id}/quotas", json=limits).status_code == 200
    return Tenant(id=tenant_id, name=name, inference_key=keys[0], admin_key=keys[1])


def sdk(gw: GatewayProcess, key: str) -> OpenAI:
    return OpenAI(base_url=gw.base_url, api_key=key, timeout=60, max_retries=0)


def chat(client: OpenAI, model: str, text: str, max_tokens: int) -> None:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
        temperature=0,
    )  # fmt: skip


def ledger_rows(gw: GatewayProcess, tenant: Tenant) -> list[dict[str, Any]]:
    r = gw.admin("GET", f"/tenants/{tenant.id}/usage")
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()
    return rows


def _wait_ledger(gw: GatewayProcess, tenant: Tenant, num_requests: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the usage writer flushes every 50 ms here
        rows = ledger_rows(gw, tenant)
        if sum(r["num_requests"] for r in rows) >= num_requests:
            return rows
        time.sleep(0.1)
    raise AssertionError("the usage ledger did not receive the requests")


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    found = find_chromium()
    if isinstance(found, str):
        print(f"SKIP dashboard browser tests: {found}")
        pytest.skip(found)
    return found


@contextmanager
def open_world(model_dir: Path, workdir: Path, **extra_env: str) -> Iterator[World]:
    """The world on `model_dir` (served as MODEL), with `extra_env` added to the gateway's
    settings (LORAGATE_MODELS: test_dashboard_several_models_browser.py); stopped, and its log
    checked for secrets, on leaving."""
    idp = LocalIdp(client_id=CLIENT_ID).start()
    port = free_port()
    env = gateway_env(
        model_dir, workdir,
        LORAGATE_OIDC_ISSUER=idp.issuer,
        LORAGATE_OIDC_AUDIENCE="loragate-admin-api",
        LORAGATE_OIDC_JWKS_URL=idp.issuer + "/jwks.json",
        LORAGATE_OIDC_CLIENT_ID=CLIENT_ID,
        LORAGATE_OIDC_REDIRECT_URL=f"http://127.0.0.1:{port}/dashboard/sso/callback",
        **extra_env,
    )  # fmt: skip
    gw = start_gateway(env, workdir, port=port)
    try:
        acme = _tenant(gw, "acme", "realtime", ACME_LIMITS)
        globex = _tenant(gw, "globex", "batch", GLOBEX_LIMITS)
        files = [(f.filename, f.data) for f in
                 demo_adapter_files(base_model_spec(model_dir, MODEL), seed=3)]  # fmt: skip
        gw.upload_adapter(acme.id, "support-bot", files)
        gw.upload_adapter(globex.id, "globex-private", files)
        client = sdk(gw, acme.inference_key)
        for i in range(3):
            chat(client, MODEL, f"Summarize ticket {i} for the support queue.", 6)
        for i in range(2):
            chat(client, "support-bot", f"Draft a reply to customer {i}.", 8)
        with pytest.raises(openai.NotFoundError):  # counted as a rejection: model_not_found
            chat(client, "no-such-model", "hello", 4)
        chat(client, MODEL, "One more for the window.", 4)
        with pytest.raises(openai.RateLimitError):  # the 60 s window holds RPM requests
            chat(client, MODEL, "Over the limit.", 4)
        other = sdk(gw, globex.inference_key)
        for i in range(2):
            chat(other, MODEL, f"Globex batch job {i}.", 5)
        _wait_ledger(gw, acme, RPM)
        _wait_ledger(gw, globex, 2)
        shots = workdir / "screenshots"
        yield World(gateway=gw, idp=idp, acme=acme, globex=globex, shots=shots,
                    pepper=env["LORAGATE_KEY_PEPPER"])  # fmt: skip
        if os.environ.get("UPDATE_DASHBOARD_SCREENSHOTS"):
            target = ROOT / "docs" / "screenshots"
            target.mkdir(parents=True, exist_ok=True)
            for png in shots.glob("*.png"):
                shutil.copy(png, target / png.name)
        print(f"dashboard screenshots: {shots}")
    finally:
        gw.stop()
        idp.stop()
    leaked = gw.leaked_secrets()
    assert not leaked, f"secrets in the gateway log: {leaked}"


@pytest.fixture(scope="session")
def world(
    chromium: tuple[str, str], tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    with open_world(tiny_model_dir, tmp_path_factory.mktemp("dashboard-browser")) as opened:
        yield opened


@pytest.fixture
def driver(chromium: tuple[str, str]) -> Iterator[webdriver.Chrome]:
    browser = start_chromium(*chromium)
    try:
        yield browser
    finally:
        browser.quit()

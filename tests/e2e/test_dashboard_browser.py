"""Issue 11, acceptance 1-3: the dashboard in a real headless Chromium, against a real
`loragate serve` process, with real requests through the OpenAI SDK.

- A tenant-admin logs in with its key and sees only its tenant; the page's used / limit /
  remaining numbers equal the quota-state API's, its usage charts equal the usage ledger's, and
  the live state follows a new rejection without a reload.
- An admin sees every tenant. A bad key, an expired or forged session, and a form posted
  without its CSRF token are refused.
- OIDC login ("Sign in with SSO") against a local identity provider (authorize, token and JWKS
  on loopback) with PKCE; a wrong audience or a tampered ID token is refused.
- Every page is saved as a screenshot (desktop 1280 px, and a phone's 390 px) under the
  test's directory; with UPDATE_DASHBOARD_SCREENSHOTS=1 also under docs/screenshots/ (what
  docs/dashboard.md shows).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from browser import find_chromium, layout_problems, screenshot, start_chromium, wait_for
from gateway_process import GatewayProcess, free_port, gateway_env, start_gateway
from itsdangerous import URLSafeTimedSerializer
from local_idp import LocalIdp
from openai import OpenAI
from pydantic import SecretStr
from selenium import webdriver
from selenium.webdriver.common.by import By

from gateway.dashboard.session import session_secret
from gateway.demo.adapters import demo_adapter_files
from tenancy.adapters.base_model import base_model_spec

pytestmark = pytest.mark.browser

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


@pytest.fixture(scope="module")
def chromium() -> tuple[str, str]:
    found = find_chromium()
    if isinstance(found, str):
        print(f"SKIP dashboard browser tests: {found}")
        pytest.skip(found)
    return found


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


def _sdk(gw: GatewayProcess, key: str) -> OpenAI:
    return OpenAI(base_url=gw.base_url, api_key=key, timeout=60, max_retries=0)


def _chat(client: OpenAI, model: str, text: str, max_tokens: int) -> None:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
        temperature=0,
    )  # fmt: skip


def _ledger(gw: GatewayProcess, tenant: Tenant) -> list[dict[str, Any]]:
    r = gw.admin("GET", f"/tenants/{tenant.id}/usage")
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()
    return rows


def _wait_ledger(gw: GatewayProcess, tenant: Tenant, num_requests: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the usage writer flushes every 50 ms here
        rows = _ledger(gw, tenant)
        if sum(r["num_requests"] for r in rows) >= num_requests:
            return rows
        time.sleep(0.1)
    raise AssertionError("the usage ledger did not receive the requests")


@pytest.fixture(scope="module")
def world(
    chromium: tuple[str, str], tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("dashboard-browser")
    idp = LocalIdp(client_id=CLIENT_ID).start()
    port = free_port()
    env = gateway_env(
        tiny_model_dir, workdir,
        LORAGATE_OIDC_ISSUER=idp.issuer,
        LORAGATE_OIDC_AUDIENCE="loragate-admin-api",
        LORAGATE_OIDC_JWKS_URL=idp.issuer + "/jwks.json",
        LORAGATE_OIDC_CLIENT_ID=CLIENT_ID,
        LORAGATE_OIDC_REDIRECT_URL=f"http://127.0.0.1:{port}/dashboard/sso/callback",
    )  # fmt: skip
    gw = start_gateway(env, workdir, port=port)
    try:
        acme = _tenant(gw, "acme", "realtime", ACME_LIMITS)
        globex = _tenant(gw, "globex", "batch", GLOBEX_LIMITS)
        files = [(f.filename, f.data) for f in
                 demo_adapter_files(base_model_spec(tiny_model_dir, MODEL), seed=3)]  # fmt: skip
        gw.upload_adapter(acme.id, "support-bot", files)
        gw.upload_adapter(globex.id, "globex-private", files)
        client = _sdk(gw, acme.inference_key)
        for i in range(3):
            _chat(client, MODEL, f"Summarize ticket {i} for the support queue.", 6)
        for i in range(2):
            _chat(client, "support-bot", f"Draft a reply to customer {i}.", 8)
        with pytest.raises(openai.NotFoundError):  # counted as a rejection: model_not_found
            _chat(client, "no-such-model", "hello", 4)
        _chat(client, MODEL, "One more for the window.", 4)
        with pytest.raises(openai.RateLimitError):  # the 60 s window holds RPM requests
            _chat(client, MODEL, "Over the limit.", 4)
        other = _sdk(gw, globex.inference_key)
        for i in range(2):
            _chat(other, MODEL, f"Globex batch job {i}.", 5)
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


@pytest.fixture
def driver(chromium: tuple[str, str]) -> Iterator[webdriver.Chrome]:
    browser = start_chromium(*chromium)
    try:
        yield browser
    finally:
        browser.quit()


# ---- helpers --------------------------------------------------------------------------------------


def open_page(d: webdriver.Chrome, world: World, path: str) -> None:
    d.get(world.gateway.url + path)


def log_in(d: webdriver.Chrome, world: World, key: str) -> None:
    open_page(d, world, "/dashboard/login")
    field = d.find_element(By.ID, "key")
    assert d.find_element(By.CSS_SELECTOR, 'label[for="key"]').text  # a labelled field
    field.send_keys(key)
    d.find_element(By.CSS_SELECTOR, 'form[action="/dashboard/login"] button[type="submit"]').click()


def number(text: str) -> int | None:
    text = text.strip()
    return None if text in ("∞", "—") else int(text.replace(",", ""))


def page_limits(d: webdriver.Chrome, scope: str = "#live") -> dict[str, dict[str, int | None]]:
    rows = {}
    for row in d.find_elements(By.CSS_SELECTOR, f"{scope} tr[data-limit]"):
        cells = {f: row.find_element(By.CSS_SELECTOR, f'[data-field="{f}"]').text
                 for f in ("used", "limit", "remaining")}  # fmt: skip
        rows[row.get_attribute("data-limit") or ""] = {k: number(v) for k, v in cells.items()}
    return rows


def api_state(world: World, tenant: Tenant) -> dict[str, Any]:
    r = world.gateway.admin("GET", f"/tenants/{tenant.id}/quota-state")
    assert r.status_code == 200, r.text
    state: dict[str, Any] = r.json()
    return state


def no_key_on_page(d: webdriver.Chrome, world: World) -> None:
    source = d.page_source
    for tenant in (world.acme, world.globex):
        for key in (tenant.inference_key, tenant.admin_key):
            assert key not in source and key[3:-4] not in source
    assert world.gateway.admin_key not in source


def chart_series(d: webdriver.Chrome, chart_id: str) -> dict[str, int]:
    figure = d.find_element(By.CSS_SELECTOR, f'figure[aria-labelledby="{chart_id}-title"]')
    return {
        row.get_attribute("data-series") or "": int(
            row.find_element(By.CSS_SELECTOR, "td[data-tokens]").get_attribute("data-tokens") or 0
        )
        for row in figure.find_elements(By.CSS_SELECTOR, "table.legend tbody tr")
    }


def readable(d: webdriver.Chrome) -> None:
    """Readable at 1280 px and on a phone (390 px): nothing cut off, chart labels big enough."""
    for width in (1280, 390):
        assert layout_problems(d, width=width) == [], (d.current_url, width)


# ---- acceptance 1 ---------------------------------------------------------------------------------


def test_tenant_admin_sees_its_tenant_and_true_numbers(
    world: World, driver: webdriver.Chrome
) -> None:
    d, acme, globex = driver, world.acme, world.globex
    log_in(d, world, acme.admin_key)
    wait_for(d, lambda d: d.current_url.endswith("/dashboard"))
    cards = d.find_elements(By.CSS_SELECTOR, "article.tenant")
    assert [c.get_attribute("data-tenant-id") for c in cards] == [acme.id]
    assert "globex" not in d.page_source and globex.id not in d.page_source
    state = api_state(world, acme)
    used = {row["name"]: row for row in state["limits"]}
    card = cards[0]
    assert number(card.find_element(By.CSS_SELECTOR, '[data-field="day_tokens"]').text) == used[
        "daily_token_budget"]["used"]  # fmt: skip
    assert number(card.find_element(By.CSS_SELECTOR, '[data-field="requests_hour"]').text) == RPM
    assert number(card.find_element(By.CSS_SELECTOR, '[data-field="rejections_hour"]').text) == 2
    no_key_on_page(d, world)
    screenshot(d, world.shots / "overview-tenant-admin.png")

    # The tenant page: the live state equals the quota-state API, the charts equal the ledger.
    d.find_element(By.LINK_TEXT, "acme").click()
    wait_for(d, lambda d: d.find_elements(By.ID, "live"))
    shown = page_limits(d)
    state = api_state(world, acme)
    assert shown == {
        row["name"]: {"used": row["used"], "limit": row["limit"], "remaining": row["remaining"]}
        for row in state["limits"]
    }
    assert shown["requests_per_minute"] == {"used": RPM, "limit": RPM, "remaining": 0}
    assert state["rejections_last_hour"] == {"model_not_found": 1, "rate_limit_exceeded": 1}
    ledger: dict[str, int] = {}
    for row in _ledger(world.gateway, acme):
        ledger[row["model"]] = ledger.get(row["model"], 0) + row["prompt_tokens"] + row[
            "completion_tokens"]  # fmt: skip
    expected = {
        ("support-bot (adapter)" if m == "support-bot" else m): t for m, t in ledger.items()
    }
    assert chart_series(d, "hourly") == expected
    assert chart_series(d, "daily") == expected
    total = int(d.find_element(By.ID, "hourly").get_attribute("data-total-tokens") or 0)
    assert total == sum(ledger.values())
    # What the ledger holds is what the quota store charged (every request settled).
    assert sum(ledger.values()) == used["daily_token_budget"]["used"]
    keys = d.find_elements(By.CSS_SELECTOR, "tr[data-key-id]")
    assert len(keys) == 2 and all("…" in k.text for k in keys)
    assert "support-bot" in d.page_source and "globex-private" not in d.page_source
    no_key_on_page(d, world)
    screenshot(d, world.shots / "tenant.png")
    screenshot(d, world.shots / "tenant-phone.png", width=390)
    readable(d)

    # Live: a new rejection shows up without a reload.
    with pytest.raises(openai.RateLimitError):
        _chat(_sdk(world.gateway, acme.inference_key), MODEL, "Still over the limit.", 4)
    wait_for(d, lambda d: d.find_element(
        By.CSS_SELECTOR, '#rejections li[data-reason="rate_limit_exceeded"] span').text == "2")  # fmt: skip
    assert d.find_element(By.ID, "live").get_attribute("data-refreshed")

    # Another tenant's page: the same 404 as a tenant that does not exist.
    open_page(d, world, f"/dashboard/tenants/{globex.id}")
    theirs = d.find_element(By.TAG_NAME, "h1").text
    open_page(d, world, "/dashboard/tenants/no-such-tenant")
    assert d.find_element(By.TAG_NAME, "h1").text == theirs == "No such tenant."
    open_page(d, world, "/dashboard/engines")
    assert "globex-private" not in d.page_source
    screenshot(d, world.shots / "engines-tenant-admin.png")


def test_admin_sees_every_tenant(world: World, driver: webdriver.Chrome) -> None:
    d = driver
    log_in(d, world, world.gateway.admin_key)
    wait_for(d, lambda d: d.current_url.endswith("/dashboard"))
    ids = {
        c.get_attribute("data-tenant-id")
        for c in d.find_elements(By.CSS_SELECTOR, "article.tenant")
    }
    assert {world.acme.id, world.globex.id} <= ids
    no_key_on_page(d, world)
    screenshot(d, world.shots / "overview.png")
    screenshot(d, world.shots / "overview-phone.png", width=390)
    readable(d)
    open_page(d, world, f"/dashboard/tenants/{world.globex.id}")
    shown = page_limits(d)
    state = api_state(world, world.globex)
    assert {k: v["used"] for k, v in shown.items()} == {
        r["name"]: r["used"] for r in state["limits"]
    }
    open_page(d, world, "/dashboard/engines")
    replica = d.find_element(By.CSS_SELECTOR, 'tr[data-replica="inprocess"]')
    assert "healthy" in replica.text and number(
        replica.find_element(By.CSS_SELECTOR, '[data-field="running"]').text) == 0  # fmt: skip
    assert "support-bot" in replica.text  # loaded on first use, shown by name to an admin
    screenshot(d, world.shots / "engines.png")
    readable(d)
    # The API docs render from the gateway's own files (this machine has no internet access).
    open_page(d, world, "/docs")
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, ".swagger-ui .opblock-tag"))
    tags = {e.text.split("\n")[0] for e in d.find_elements(By.CSS_SELECTOR, ".opblock-tag")}
    assert {"inference", "tenants", "quotas", "dashboard"} <= tags
    d.set_window_size(1280, 900)
    d.save_screenshot(str(world.shots / "api-docs.png"))


def test_bad_key_expired_session_and_missing_csrf_are_refused(
    world: World, driver: webdriver.Chrome
) -> None:
    d = driver
    open_page(d, world, "/dashboard/login")
    screenshot(d, world.shots / "login.png")
    readable(d)
    log_in(d, world, "lg_" + "x" * 49)
    alert = wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, '[role="alert"]'))
    assert "not accepted" in alert[0].text  # type: ignore[index]
    assert d.get_cookie("lg_session") is None
    log_in(d, world, world.acme.inference_key)  # a valid key without an admin scope
    wait_for(d, lambda d: "tenant-admin scope" in d.page_source)
    assert d.get_cookie("lg_session") is None

    # A form posted without its CSRF token (the page's hidden field removed) is refused.
    log_in(d, world, world.acme.admin_key)
    wait_for(d, lambda d: d.current_url.endswith("/dashboard"))
    d.execute_script("document.querySelector('form[action=\"/dashboard/logout\"] "
                     "input[name=csrf_token]').remove()")  # fmt: skip
    d.find_element(By.CSS_SELECTOR, 'form[action="/dashboard/logout"] button').click()
    wait_for(d, lambda d: "This form expired" in d.page_source)
    open_page(d, world, "/dashboard")
    assert d.find_elements(By.CSS_SELECTOR, "article.tenant")  # the session still holds

    # An expired session (signed right, its time over) and a forged one: back to the login form.
    settings = SimpleNamespace(dashboard_session_secret=None, key_pepper=SecretStr(world.pepper))
    serializer = URLSafeTimedSerializer(session_secret(settings), salt="lg-session")  # type: ignore[arg-type]
    real = serializer.loads(d.get_cookie("lg_session")["value"])  # type: ignore[index]
    for value in (
        serializer.dumps({**real, "expires_at": time.time() - 1}),
        URLSafeTimedSerializer(b"guessed" * 6, salt="lg-session").dumps(real),
    ):
        d.delete_cookie("lg_session")
        d.add_cookie({"name": "lg_session", "value": value, "path": "/dashboard",
                      "httpOnly": True, "sameSite": "Strict"})  # fmt: skip
        open_page(d, world, "/dashboard")
        wait_for(d, lambda d: "/dashboard/login" in d.current_url)
        assert "Your session expired" in d.page_source
        assert not d.find_elements(By.CSS_SELECTOR, "article.tenant")


# ---- acceptance 2: OIDC -----------------------------------------------------------------------


def sso(d: webdriver.Chrome, world: World) -> None:
    d.delete_all_cookies()
    open_page(d, world, "/dashboard/login")
    d.find_element(By.LINK_TEXT, "Sign in with SSO").click()


def test_oidc_login(world: World, driver: webdriver.Chrome) -> None:
    d, idp = driver, world.idp
    idp.mode = "good"
    idp.next_claims = {"roles": ["loragate-tenant-admin"], "loragate_tenant": world.acme.id}
    checked = idp.pkce_checked
    sso(d, world)
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "article.tenant"))
    cards = d.find_elements(By.CSS_SELECTOR, "article.tenant")
    assert [c.get_attribute("data-tenant-id") for c in cards] == [world.acme.id]
    assert idp.pkce_checked == checked + 1  # the code was exchanged with its PKCE verifier
    cookie = d.get_cookie("lg_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    idp.next_claims = {"roles": ["loragate-admin"]}
    sso(d, world)
    wait_for(d, lambda d: len(d.find_elements(By.CSS_SELECTOR, "article.tenant")) >= 2)
    screenshot(d, world.shots / "overview-sso-admin.png")

    for mode, claims in (
        ("wrong-audience", {"roles": ["loragate-admin"]}),
        ("tampered", {"roles": ["viewer"]}),  # tampered into an admin: the signature breaks
        ("good", {"roles": ["viewer"]}),  # a valid token without a dashboard role
    ):
        idp.mode, idp.next_claims = mode, claims
        sso(d, world)
        wait_for(d, lambda d: "/dashboard/" in d.current_url and d.find_elements(
            By.CSS_SELECTOR, '[role="alert"]'))  # fmt: skip
        assert "did not complete" in d.page_source, mode
        assert d.get_cookie("lg_session") is None, mode
        open_page(d, world, "/dashboard")
        assert "/dashboard/login" in d.current_url, mode
    idp.mode = "good"

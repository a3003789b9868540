"""Issue 11, acceptance 1 (what is refused) and 2 (SSO): who the dashboard lets in, in a real
headless Chromium against a real `loragate serve` process (tests/e2e/dashboard_world.py).

- A bad key, a key without an admin scope, an expired or forged session, and a form posted
  without its CSRF token are refused.
- OIDC login ("Sign in with SSO") against a local identity provider (authorize, token and JWKS
  on loopback) with PKCE; a wrong audience, a tampered ID token or a token without a dashboard
  role is refused.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from browser import screenshot, wait_for
from dashboard_pages import log_in, open_page, readable, sso
from dashboard_world import World
from itsdangerous import URLSafeTimedSerializer
from pydantic import SecretStr
from selenium import webdriver
from selenium.webdriver.common.by import By

from gateway.dashboard.session import session_secret

pytestmark = pytest.mark.browser


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


# ---- OIDC ----------------------------------------------------------------------------------------


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

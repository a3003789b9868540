"""The dashboard's security lines, through the real app: login with admin and tenant-admin keys
only, sessions signed, HttpOnly, SameSite=Strict and expiring, CSRF on every form, a
tenant-admin sees only its own tenant (another tenant's page is the 404 of one that does not
exist), no key text on any page, and a revoked key ends its session."""

from __future__ import annotations

import datetime as dt
import time

import httpx
import pytest
from gateway_harness import ADMIN_CTX, Gateway, TenantKey
from itsdangerous import URLSafeTimedSerializer
from pages import csrf_of, login

from gateway.dashboard.session import session_secret
from tenancy.auth.scopes import Scope
from tenancy.crud.keys import revoke_key

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _tenant_admin(gateway: Gateway, **limits: int) -> TenantKey:
    return await gateway.tenant(scopes=(Scope.TENANT_ADMIN, Scope.INFERENCE), **limits)


async def test_unauthenticated_pages_redirect_to_login(browser: httpx.AsyncClient) -> None:
    for path in ("/dashboard", "/dashboard/engines", "/dashboard/tenants/x"):
        r = await browser.get(path)
        assert r.status_code == 303 and r.headers["location"] == "/dashboard/login", path
    r = await browser.get("/dashboard/tenants/x/quota-state")
    assert r.status_code == 303


async def test_bad_keys_are_refused(gateway: Gateway, browser: httpx.AsyncClient) -> None:
    inference_only = await gateway.tenant()
    for key in ("lg_" + "A" * 49, "' OR '1'='1", "", inference_only.key):
        r = await login(browser, key)
        assert r.status_code in (400, 401, 403), key[:6]
        assert "lg_session" not in r.cookies
        assert key == "" or key not in r.text  # never echoed
    r = await login(browser, inference_only.key)
    assert r.status_code == 403 and "tenant-admin scope" in r.text


async def test_session_cookie_flags(gateway: Gateway, browser: httpx.AsyncClient) -> None:
    ta = await _tenant_admin(gateway)
    r = await login(browser, ta.key)
    assert r.status_code == 200, r.text
    cookie = next(v for k, v in r.headers.multi_items() if k == "set-cookie" and "lg_session" in v)
    flags = {part.strip().lower() for part in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/dashboard"} <= flags
    assert any(f.startswith("max-age=") for f in flags)
    assert "secure" not in flags  # served over plain http here; over TLS it is set (below)
    assert ta.key not in cookie and ta.key[-8:] not in cookie


async def test_secure_cookie_over_tls(gateway: Gateway) -> None:
    ta = await _tenant_admin(gateway)
    transport = gateway.client._transport
    async with httpx.AsyncClient(transport=transport, base_url="https://gateway") as client:
        r = await login(client, ta.key)
        cookie = next(v for k, v in r.headers.multi_items() if "lg_session" in v)
        assert "secure" in cookie.lower()


async def test_tenant_admin_sees_only_its_tenant(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    mine = await _tenant_admin(gateway, requests_per_minute=50)
    other = await _tenant_admin(gateway, requests_per_minute=70)
    await login(browser, mine.key)
    overview = await browser.get("/dashboard")
    assert overview.status_code == 200
    assert mine.tenant_id in overview.text and other.tenant_id not in overview.text
    assert overview.text.count('class="card tenant"') == 1
    r = await browser.get(f"/dashboard/tenants/{mine.tenant_id}")
    assert r.status_code == 200 and mine.tenant_id in r.text
    theirs = await browser.get(f"/dashboard/tenants/{other.tenant_id}")
    missing = await browser.get("/dashboard/tenants/no-such-tenant")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.text == missing.text  # nothing tells them apart
    r = await browser.get(f"/dashboard/tenants/{other.tenant_id}/quota-state")
    assert r.status_code == 404


async def test_admin_sees_every_tenant(gateway: Gateway, browser: httpx.AsyncClient) -> None:
    admin = await gateway.tenant(scopes=(Scope.ADMIN,))
    a, b = await _tenant_admin(gateway), await _tenant_admin(gateway)
    await login(browser, admin.key)
    overview = (await browser.get("/dashboard")).text
    assert a.tenant_id in overview and b.tenant_id in overview and admin.tenant_id in overview
    for t in (a, b):
        assert (await browser.get(f"/dashboard/tenants/{t.tenant_id}")).status_code == 200


async def test_no_key_text_on_any_page(gateway: Gateway, browser: httpx.AsyncClient) -> None:
    admin = await gateway.tenant(scopes=(Scope.ADMIN,))
    ta = await _tenant_admin(gateway)
    await login(browser, admin.key)
    pages = ["/dashboard", "/dashboard/engines", f"/dashboard/tenants/{ta.tenant_id}",
             f"/dashboard/tenants/{admin.tenant_id}", f"/dashboard/tenants/{ta.tenant_id}/quota-state",
             "/dashboard/login"]  # fmt: skip
    secrets = [admin.key, ta.key]
    for path in pages:
        text = (await browser.get(path)).text
        for key in secrets:
            # Neither the key nor its secret part; the masked form is prefix and last four.
            assert key not in text and key[3:-4] not in text and key[3:20] not in text, path
    tenant_page = (await browser.get(f"/dashboard/tenants/{ta.tenant_id}")).text
    assert f"{ta.key[:11]}…{ta.key[-4:]}" in tenant_page  # the stored prefix, the last four


async def test_pages_are_not_cached_and_locked_down(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    await login(browser, (await _tenant_admin(gateway)).key)
    r = await browser.get("/dashboard")
    assert r.headers["cache-control"] == "no-store"
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    assert r.headers["x-frame-options"] == "DENY"
    assert (await browser.get("/dashboard/static/dashboard.css")).status_code == 200
    for bad in ("../app.py", "..%2Fapp.py", "dashboard.css/../../app.py", "session.py"):
        assert (await browser.get(f"/dashboard/static/{bad}")).status_code == 404, bad


async def test_forms_need_their_csrf_token(gateway: Gateway, browser: httpx.AsyncClient) -> None:
    ta = await _tenant_admin(gateway)
    # The login form: its token is bound to the form's own signed cookie.
    form = await browser.get("/dashboard/login")
    r = await browser.post("/dashboard/login", data={"key": ta.key})
    assert r.status_code == 403 and "lg_session" not in r.cookies
    r = await browser.post("/dashboard/login", data={"key": ta.key, "csrf_token": "forged"})
    assert r.status_code == 403
    async with httpx.AsyncClient(transport=browser._transport, base_url="http://gateway") as fresh:
        r = await fresh.post(
            "/dashboard/login", data={"key": ta.key, "csrf_token": csrf_of(form.text)}
        )  # another browser's token, without its cookie
        assert r.status_code == 403
    # Logout: the session's token.
    await login(browser, ta.key)
    page = await browser.get("/dashboard")
    r = await browser.post("/dashboard/logout", data={})
    assert r.status_code == 403
    r = await browser.post("/dashboard/logout", data={"csrf_token": "forged"})
    assert r.status_code == 403
    assert (await browser.get("/dashboard")).status_code == 200  # still logged in
    r = await browser.post("/dashboard/logout", data={"csrf_token": csrf_of(page.text)})
    assert r.status_code == 303
    assert (await browser.get("/dashboard")).status_code == 303


async def test_expired_and_forged_sessions_are_refused(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    ta = await _tenant_admin(gateway)
    await login(browser, ta.key)
    assert (await browser.get("/dashboard")).status_code == 200
    real = browser.cookies.get("lg_session", path="/dashboard")
    serializer = URLSafeTimedSerializer(session_secret(gateway.state.settings), salt="lg-session")
    data = serializer.loads(real)
    expired = serializer.dumps({**data, "expires_at": time.time() - 1})
    forged = URLSafeTimedSerializer(b"not the secret" * 3, salt="lg-session").dumps(data)
    domain = next(c.domain for c in browser.cookies.jar if c.name == "lg_session")
    for cookie in (expired, forged, real[:-4] + "AAAA"):
        browser.cookies.clear()
        browser.cookies.set("lg_session", cookie, domain=domain, path="/dashboard")
        r = await browser.get("/dashboard")
        assert r.status_code == 303
        assert r.headers["location"] == "/dashboard/login?reason=expired"
    login_page = await browser.get("/dashboard/login?reason=expired")
    assert "session expired" in login_page.text


async def test_revoking_the_key_ends_its_session(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    ta = await _tenant_admin(gateway)
    await login(browser, ta.key)
    assert (await browser.get("/dashboard")).status_code == 200
    keys = (await browser.get(f"/dashboard/tenants/{ta.tenant_id}")).text
    assert "active" in keys
    async with gateway.state.tenancy.sessionmaker() as session:
        key_id = (await gateway.state.tenancy.keys.verify(ta.key)).key_id
        await revoke_key(session, ctx=ADMIN_CTX, tenant_id=ta.tenant_id, key_id=key_id,
                         now=dt.datetime.now(dt.UTC))  # fmt: skip
    r = await browser.get("/dashboard")
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/login?reason=ended"

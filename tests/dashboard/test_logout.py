"""Issue 45, rough edge: dashboard logout ends the session on the server, on every replica. Before,
logout only cleared the browser's cookie, and a copy of it kept working until it expired."""

from __future__ import annotations

import httpx
import pytest
from gateway_harness import Gateway, running_gateway
from pages import csrf_of, login

from tenancy.auth.scopes import Scope

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _client(gateway: Gateway, cookie: str | None = None) -> httpx.AsyncClient:
    """A browser of its own; with `cookie`, one that sends a copy of another's session."""
    headers = {} if cookie is None else {"cookie": f"lg_session={cookie}"}
    return httpx.AsyncClient(
        transport=gateway.client._transport, base_url="http://gateway", headers=headers
    )


async def _page(client: httpx.AsyncClient, path: str = "/dashboard") -> httpx.Response:
    return await client.get(path)


async def test_a_copied_cookie_is_refused_after_logout_on_every_replica(gateway: Gateway) -> None:
    ta = await gateway.tenant(scopes=(Scope.TENANT_ADMIN, Scope.INFERENCE))
    # A second replica: another app on the same database with the same secrets.
    async with running_gateway(gateway.state.settings, gateway.scan) as other:
        async with _client(gateway) as browser:
            await login(browser, ta.key)
            copied = browser.cookies.get("lg_session", path="/dashboard")
            assert copied
            async with _client(gateway, copied) as thief, _client(other, copied) as elsewhere:
                assert (await _page(thief)).status_code == 200  # the copy works, as it should
                assert (await _page(elsewhere)).status_code == 200  # on either replica
                page = await _page(browser)
                r = await browser.post("/dashboard/logout", data={"csrf_token": csrf_of(page.text)})
                assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
                for client in (thief, elsewhere):
                    for path in ("/dashboard", f"/dashboard/tenants/{ta.tenant_id}/quota-state"):
                        r = await _page(client, path)
                        assert r.status_code == 303, path
                        assert r.headers["location"] == "/dashboard/login", path
        # Logging in again is a new session, which works; the ended one stays ended.
        async with _client(other) as browser:
            assert (await login(browser, ta.key)).status_code == 200
            assert (await _page(browser)).status_code == 200
        async with _client(gateway, copied) as thief:
            assert (await _page(thief)).status_code == 303

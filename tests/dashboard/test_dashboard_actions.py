"""Issue 45, item 1: the dashboard's forms, in-process (the browser tests are
tests/e2e/test_dashboard_actions_browser.py). The security lines: a form without this session's
CSRF token, or with another's, is refused (403) and changes nothing; a tenant-admin reaches no
other tenant through a crafted POST (404, nothing changed); a new key is on the page that
answers its creation and nowhere else (not in the audit log, not in a log record). Also: the
quota form changes only the fields edited, and the audit CSV holds the viewer's tenant only."""

from __future__ import annotations

import csv
import datetime as dt
import io

import httpx
import pytest
from gateway_harness import Gateway, TenantKey
from pages import csrf_of, login
from sqlalchemy import select

from tenancy.auth.scopes import Scope
from tenancy.sql.models import ApiKey, AuditEvent, QuotaPolicy, Tenant

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _tenant_admin(gateway: Gateway, **limits: int) -> TenantKey:
    return await gateway.tenant(scopes=(Scope.TENANT_ADMIN, Scope.INFERENCE), **limits)


async def _counts(gateway: Gateway) -> tuple[int, ...]:
    """What any form could change: tenants (and their status), keys (and revocations), quota
    policies, audit events."""
    async with gateway.state.tenancy.sessionmaker() as session:
        tenants = (await session.scalars(select(Tenant))).all()
        keys = (await session.scalars(select(ApiKey))).all()
        return (
            len(tenants),
            sum(t.status == "suspended" for t in tenants),
            len(keys),
            sum(k.revoked_at is not None or k.replaced_by_id is not None for k in keys),
            len((await session.scalars(select(QuotaPolicy))).all()),
            len((await session.scalars(select(AuditEvent))).all()),
        )


async def _key_id(gateway: Gateway, tenant: TenantKey) -> str:
    return (await gateway.state.tenancy.keys.verify(tenant.key)).key_id


def _forms(tenant_id: str, key_id: str) -> list[tuple[str, dict[str, str]]]:
    t = f"/dashboard/tenants/{tenant_id}"
    return [
        ("/dashboard/tenants", {"name": "crafted-tenant"}),
        (f"{t}/status", {"status": "suspended"}),
        (f"{t}/keys", {"name": "crafted-key", "scopes": "inference"}),
        (f"{t}/keys/{key_id}/rotate", {}),
        (f"{t}/keys/{key_id}/revoke", {}),
        (f"{t}/quotas", {"requests_per_minute": "1", "was_requests_per_minute": ""}),
    ]


async def test_forms_without_the_sessions_csrf_token_are_refused(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    admin = await gateway.tenant(scopes=(Scope.ADMIN,))
    victim = await _tenant_admin(gateway)
    victim_key = await _key_id(gateway, victim)
    # Another session's token is as wrong as none: a token belongs to its session.
    async with httpx.AsyncClient(
        transport=gateway.client._transport, base_url="http://gateway"
    ) as other:
        await login(other, victim.key)
        foreign = csrf_of((await other.get("/dashboard")).text)
    await login(browser, admin.key)
    before = await _counts(gateway)
    for path, data in _forms(victim.tenant_id, victim_key):
        for token in (None, "", "x" * 43, foreign):
            body = data if token is None else {**data, "csrf_token": token}
            r = await browser.post(path, data=body)
            assert r.status_code == 403, (path, token, r.status_code)
            assert "This form expired" in r.text
    r = await browser.post(
        f"/dashboard/tenants/{victim.tenant_id}/adapters", data={"name": "x", "csrf_token": foreign},
        files={"files": ("adapter_config.json", b"{}")}, headers={"accept": "application/json"},
    )  # fmt: skip
    assert r.status_code == 403 and "expired" in r.json()["error"]["message"]
    assert await _counts(gateway) == before


async def test_a_tenant_admin_cannot_act_on_another_tenant(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    mine = await _tenant_admin(gateway)
    theirs = await _tenant_admin(gateway, requests_per_minute=70)
    their_key = await _key_id(gateway, theirs)
    await login(browser, mine.key)
    token = csrf_of((await browser.get("/dashboard")).text)
    before = await _counts(gateway)
    for path, data in _forms(theirs.tenant_id, their_key):
        r = await browser.post(path, data={**data, "csrf_token": token})
        # Creating a tenant is the operator's (403); anything of another tenant is the 404 of
        # a tenant that does not exist.
        assert r.status_code == (403 if path == "/dashboard/tenants" else 404), path
    # Their key named under my tenant: still not found.
    mine_t = f"/dashboard/tenants/{mine.tenant_id}"
    for action in ("rotate", "revoke"):
        r = await browser.post(f"{mine_t}/keys/{their_key}/{action}", data={"csrf_token": token})
        assert r.status_code == 404
    r = await browser.post(
        f"{mine_t}/quotas", data={"csrf_token": token, "key_id": their_key,
                                  "requests_per_minute": "5", "was_requests_per_minute": ""},
    )  # fmt: skip
    assert r.status_code == 404
    r = await browser.post(
        f"/dashboard/tenants/{theirs.tenant_id}/adapters", data={"name": "x", "csrf_token": token},
        files={"files": ("adapter_config.json", b"{}")}, headers={"accept": "application/json"},
    )  # fmt: skip
    assert r.status_code == 404
    assert await _counts(gateway) == before
    # Their pages: the same 404 as a tenant that does not exist.
    for page in ("keys", "quotas", "adapters", "usage"):
        r = await browser.get(f"/dashboard/tenants/{theirs.tenant_id}/{page}")
        assert r.status_code == 404 and theirs.tenant_id not in r.text, page


async def test_a_new_key_is_shown_once_and_never_audited(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    ta = await _tenant_admin(gateway)
    await login(browser, ta.key)
    keys_page = await browser.get(f"/dashboard/tenants/{ta.tenant_id}/keys")
    token = csrf_of(keys_page.text)
    r = await browser.post(
        f"/dashboard/tenants/{ta.tenant_id}/keys",
        data={"name": "shown-once", "scopes": "inference", "csrf_token": token},
    )
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    new_key = gateway.scan.add(r.text.split('readonly value="')[1].split('"')[0])
    assert (await gateway.state.tenancy.keys.verify(new_key)).tenant_id == ta.tenant_id
    assert "set-cookie" not in r.headers and new_key not in str(r.url)
    again = await browser.get(f"/dashboard/tenants/{ta.tenant_id}/keys")
    assert new_key not in again.text and new_key[3:-4] not in again.text
    async with gateway.state.tenancy.sessionmaker() as session:
        events = (await session.scalars(select(AuditEvent))).all()
    assert any(e.action == "key.create" and e.after and e.after["name"] == "shown-once"
               for e in events)  # fmt: skip
    assert not [e.id for e in events if new_key in f"{e.before}{e.after}"]


async def test_the_quota_form_changes_only_the_fields_edited(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    admin = await gateway.tenant(scopes=(Scope.ADMIN,))
    t = await _tenant_admin(gateway, requests_per_minute=100, tokens_per_minute=5000)
    await login(browser, admin.key)
    page = await browser.get(f"/dashboard/tenants/{t.tenant_id}/quotas")
    assert 'name="requests_per_minute" type="number"' in page.text and 'value="100"' in page.text
    # Someone else raises tokens_per_minute after the form was shown ...
    r = await gateway.client.put(
        f"/admin/v1/tenants/{t.tenant_id}/quotas", headers={"authorization": f"Bearer {admin.key}"},
        json={"requests_per_minute": 100, "tokens_per_minute": 9000},
    )  # fmt: skip
    assert r.status_code == 200
    # ... and this form, as shown (tokens 5000), edits only requests_per_minute and the budget.
    form = {
        "csrf_token": csrf_of(page.text), "requests_per_minute": "40", "was_requests_per_minute": "100",
        "tokens_per_minute": "5000", "was_tokens_per_minute": "5000",
        "daily_token_budget": "1,000", "was_daily_token_budget": "",
    }  # fmt: skip
    r = await browser.post(f"/dashboard/tenants/{t.tenant_id}/quotas", data=form)
    assert r.status_code == 303 and r.headers["location"].endswith("done=quota-saved")
    policy = (await gateway.client.get(
        f"/admin/v1/tenants/{t.tenant_id}/quotas", headers={"authorization": f"Bearer {admin.key}"},
    )).json()  # fmt: skip
    assert (policy["requests_per_minute"], policy["tokens_per_minute"]) == (40, 9000)
    assert policy["daily_token_budget"] == 1000 and policy["max_concurrent"] is None
    r = await browser.post(
        f"/dashboard/tenants/{t.tenant_id}/quotas",
        data={**form, "requests_per_minute": "-3"},
    )
    assert r.status_code == 400 and "requests_per_minute: a whole number" in r.text


async def test_the_audit_csv_is_the_viewers_tenant_only(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    mine = await _tenant_admin(gateway)
    theirs = await _tenant_admin(gateway)
    await login(browser, mine.key)
    token = csrf_of((await browser.get("/dashboard")).text)
    await browser.post(f"/dashboard/tenants/{mine.tenant_id}/keys",
                       data={"name": "csv-key", "csrf_token": token})  # fmt: skip
    today = dt.datetime.now(dt.UTC).date().isoformat()
    # Asking for the other tenant's events gives none; the filter holds.
    r = await browser.get(f"/dashboard/audit.csv?tenant_id={theirs.tenant_id}")
    assert r.status_code == 200 and list(csv.reader(io.StringIO(r.text)))[1:] == []
    r = await browser.get(f"/dashboard/audit.csv?action=key.create&from={today}&to={today}")
    assert r.headers["content-disposition"].startswith("attachment; filename=")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert rows and {row["tenant_id"] for row in rows} == {mine.tenant_id}
    assert {row["action"] for row in rows} == {"key.create"}
    assert any('"name": "csv-key"' in row["after"] for row in rows)
    page = await browser.get("/dashboard/audit")
    assert theirs.tenant_id not in page.text and 'data-action="key.create"' in page.text

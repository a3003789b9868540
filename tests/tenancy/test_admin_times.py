"""Times a client sends without a zone are UTC (issue 10: `expires_at` and `?since=` used to be
a 500); times with a zone are converted to UTC."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from admin_harness import Harness
from tenancy_factories import SecretRegistry


def _utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize(
    "sent", ["2031-01-02T03:04:05", "2031-01-02T05:04:05+02:00", "2031-01-02T03:04:05Z"]
)
async def test_key_expiry_without_a_zone_is_utc(
    h: Harness, secret_registry: SecretRegistry, sent: str
) -> None:
    r = await h.call("POST", "/tenants", json={"name": f"t-{uuid.uuid4().hex[:6]}"})
    tenant = r.json()["id"]
    r = await h.call("POST", f"/tenants/{tenant}/keys", json={"name": "k", "expires_at": sent})
    assert r.status_code == 201, r.text
    secret_registry.add(r.json()["key"])
    listed = (await h.call("GET", f"/tenants/{tenant}/keys")).json()
    expected = dt.datetime(2031, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert [_utc(k["expires_at"]) for k in listed] == [expected]


async def test_audit_since_and_until_without_a_zone_are_utc(h: Harness) -> None:
    r = await h.call("POST", "/tenants", json={"name": f"t-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)  # naive, as a person types it
    before = (now - dt.timedelta(minutes=5)).isoformat(timespec="seconds")
    after = (now + dt.timedelta(minutes=5)).isoformat(timespec="seconds")
    r = await h.call("GET", "/audit", params={"since": before, "until": after})
    assert r.status_code == 200, r.text
    assert "tenant.create" in {e["action"] for e in r.json()}
    r = await h.call("GET", "/audit", params={"since": after})
    assert r.status_code == 200 and r.json() == []
    r = await h.call("GET", "/audit", params={"since": "yesterday"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "since"

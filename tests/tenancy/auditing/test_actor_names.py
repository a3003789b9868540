"""Issue 45, rough edge: the audit log's actor reads as the key's name (`actor_name`), not only
`key:<uuid>` (kept as `actor`), also after the key is revoked, rotated or deleted with its
tenant; `loragate admin audit`'s table shows the name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from admin_harness import Harness, admin_harness
from tenancy_factories import SecretRegistry

from tenancy.admin_cli import render
from tenancy.admin_cli.commands import AUDIT
from tenancy.settings import TenancySettings


async def _ok(h: Harness, method: str, path: str, key: str | None = None, **kw: Any) -> Any:
    r = await h.call(method, path, key, **kw)
    assert r.status_code < 300, (method, path, r.text)
    return r.json() if r.content else None


async def test_actor_names_outlive_the_key(
    make_settings: Callable[..., TenancySettings],
    secret_registry: SecretRegistry,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with admin_harness(make_settings()) as h:
        secret_registry.add(h.admin_key)
        tid = (await _ok(h, "POST", "/tenants", json={"name": "acme"}))["id"]
        ops = await _ok(
            h, "POST", f"/tenants/{tid}/keys",
            json={"name": "acme-ops", "scopes": ["tenant-admin", "inference"]},
        )  # fmt: skip
        secret_registry.add(ops["key"])
        # The tenant-admin key acts: one event with it as the actor.
        made = await _ok(h, "POST", f"/tenants/{tid}/keys", ops["key"], json={"name": "ci"})
        secret_registry.add(made["key"])

        def by_ops(events: list[dict[str, Any]]) -> dict[str, Any]:
            (event,) = [e for e in events if e["actor"] == f"key:{ops['id']}"]
            return event

        event = by_ops(await _ok(h, "GET", f"/audit?tenant_id={tid}"))
        assert event["action"] == "key.create" and event["actor_name"] == "acme-ops"
        own = by_ops(await _ok(h, "GET", "/audit", ops["key"]))  # its own view, too
        assert own["actor_name"] == "acme-ops"

        await _ok(h, "POST", f"/tenants/{tid}/keys/{ops['id']}/revoke")
        event = by_ops(await _ok(h, "GET", f"/audit?tenant_id={tid}"))
        assert event["actor_name"] == "acme-ops"
        await _ok(h, "DELETE", f"/tenants/{tid}")  # its keys go with it; the log stays
        event = by_ops(await _ok(h, "GET", f"/audit?tenant_id={tid}"))
        assert event["actor_name"] == "acme-ops"
        monkeypatch.setenv("COLUMNS", "200")
        capsys.readouterr()
        render.table([event], AUDIT)  # what `loragate admin audit` prints for it
        table = capsys.readouterr().out
        assert "acme-ops" in table and ops["id"] not in table

        # The bootstrap admin key is named too; actors that are not keys read as themselves.
        events = await _ok(h, "GET", "/audit?limit=1000")
        admin_events = [e for e in events if e["action"] == "tenant.delete"]
        assert [e["actor_name"] for e in admin_events] == ["bootstrap-admin"]
        system = [e for e in events if e["actor"] == "system:bootstrap"]
        assert system and all(e["actor_name"] == "system:bootstrap" for e in system)

"""Acceptance 6: every admin mutation (every mutating route) leaves an audit event with the
object before and after, the actor, the request id and the client address."""

from __future__ import annotations

from collections.abc import Callable

from adapter_builders import make_peft_adapter, scratch_dir
from admin_harness import admin_harness
from tenancy_factories import SecretRegistry

from tenancy.settings import TenancySettings

# action -> (has before, has after); None: either (a quota put creates or replaces a policy)
EXPECTED: dict[str, tuple[bool | None, bool]] = {
    "tenant.create": (False, True),
    "tenant.update": (True, True),
    "tenant.rotate_salt": (True, True),
    "tenant.delete": (True, False),
    "key.create": (False, True),
    "key.rotate": (True, True),
    "key.revoke": (True, True),
    "quota.put": (None, True),
    "adapter.create": (False, True),
    "adapter.delete": (True, False),
    "alias.create": (False, True),
    "alias.switch": (True, True),
    "alias.canary_set": (True, True),
    "alias.canary_clear": (True, True),
    "alias.delete": (True, False),
    "price.put": (False, True),
    "webhook.create": (False, True),
    "webhook.update": (True, True),
    "webhook.rotate_secret": (True, True),
    "webhook.test": (False, True),
    "webhook.delete": (True, False),
}


async def test_every_mutating_route_is_audited(
    make_settings: Callable[..., TenancySettings], secret_registry: SecretRegistry
) -> None:
    out = scratch_dir()
    files = [("files", (p.name, p.read_bytes())) for p in make_peft_adapter(out / "a").iterdir()]
    async with admin_harness(make_settings()) as h:
        secret_registry.add(h.admin_key)
        mutating = {
            (method.upper(), path)
            for path, ops in h.app.openapi()["paths"].items()
            for method in ops
            if method in {"post", "put", "patch", "delete"}
        }
        assert len(mutating) == 26
        called: set[tuple[str, str]] = set()

        async def call(method: str, template: str, path: str, **kw: object) -> dict[str, object]:
            called.add((method, "/admin/v1" + template))
            r = await h.call(method, path, headers={"x-request-id": "req-audit"}, **kw)
            assert r.status_code < 300, (method, path, r.text)
            return dict(r.json()) if r.content else {}

        t = await call("POST", "/tenants", "/tenants", json={"name": "audited"})
        tid = t["id"]
        await call("PATCH", "/tenants/{tenant_id}", f"/tenants/{tid}", json={"tier": "batch"})
        await call("POST", "/tenants/{tenant_id}/salt/rotate", f"/tenants/{tid}/salt/rotate")
        k = await call(
            "POST", "/tenants/{tenant_id}/keys", f"/tenants/{tid}/keys", json={"name": "k"}
        )
        secret_registry.add(str(k["key"]))
        kid = k["id"]
        rotated = await call(
            "POST", "/tenants/{tenant_id}/keys/{key_id}/rotate",
            f"/tenants/{tid}/keys/{kid}/rotate", json={},
        )  # fmt: skip
        secret_registry.add(str(rotated["key"]))
        await call(
            "POST", "/tenants/{tenant_id}/keys/{key_id}/revoke",
            f"/tenants/{tid}/keys/{rotated['id']}/revoke",
        )  # fmt: skip
        await call(
            "PUT", "/tenants/{tenant_id}/quotas", f"/tenants/{tid}/quotas",
            json={"requests_per_minute": 5},
        )  # fmt: skip
        await call(
            "PUT", "/tenants/{tenant_id}/quotas", f"/tenants/{tid}/quotas",
            json={"requests_per_minute": 7},
        )  # fmt: skip
        await call(
            "PUT", "/tenants/{tenant_id}/keys/{key_id}/quotas",
            f"/tenants/{tid}/keys/{kid}/quotas", json={"max_concurrent": 1},
        )  # fmt: skip
        a = await call(
            "POST", "/tenants/{tenant_id}/adapters", f"/tenants/{tid}/adapters",
            data={"name": "lora"}, files=files,
        )  # fmt: skip
        pub = await call("POST", "/adapters", "/adapters", data={"name": "pub"}, files=files)
        assert pub["owner_tenant_id"] is None
        # a second version of each, staged; the alias switched, a canary set and cleared
        staged = {"name": "lora", "activate": "false"}
        await call("POST", "/tenants/{tenant_id}/adapters", f"/tenants/{tid}/adapters",
                   data=staged, files=files)  # fmt: skip
        await call("POST", "/adapters", "/adapters", data={**staged, "name": "pub"}, files=files)
        alias = "/tenants/{tenant_id}/adapter-aliases/{name}"
        await call("PUT", alias, f"/tenants/{tid}/adapter-aliases/lora", json={"version": 2})
        await call("PUT", alias + "/canary", f"/tenants/{tid}/adapter-aliases/lora/canary",
                   json={"version": 1, "weight": 10})  # fmt: skip
        await call("DELETE", alias + "/canary", f"/tenants/{tid}/adapter-aliases/lora/canary")
        await call(
            "DELETE", "/tenants/{tenant_id}/adapters/{adapter_id}",
            f"/tenants/{tid}/adapters/{a['id']}",
        )  # fmt: skip
        await call("DELETE", alias, f"/tenants/{tid}/adapter-aliases/lora?with_versions=true")
        public = "/adapter-aliases/{name}"
        await call("PUT", public, "/adapter-aliases/pub", json={"version": 2})
        await call("PUT", public + "/canary", "/adapter-aliases/pub/canary",
                   json={"version": 1, "weight": 5})  # fmt: skip
        await call("DELETE", public + "/canary", "/adapter-aliases/pub/canary")
        await call("DELETE", public, "/adapter-aliases/pub?with_versions=true")
        hook = "/tenants/{tenant_id}/webhook"
        made = await call("POST", hook, f"/tenants/{tid}/webhook",
                          json={"url": "https://93.184.216.34/hook"})  # fmt: skip
        secret_registry.add(str(made["secret"]))
        await call("PATCH", hook, f"/tenants/{tid}/webhook", json={"thresholds": [90]})
        rotated_secret = await call(
            "POST", hook + "/rotate-secret", f"/tenants/{tid}/webhook/rotate-secret"
        )
        secret_registry.add(str(rotated_secret["secret"]))
        await call("POST", hook + "/test", f"/tenants/{tid}/webhook/test")
        await call("DELETE", hook, f"/tenants/{tid}/webhook")
        await call("DELETE", "/tenants/{tenant_id}", f"/tenants/{tid}")
        await call(
            "PUT", "/prices", "/prices", json={"model": "tiny", "prompt": 1, "completion": 2}
        )
        assert called == mutating, mutating - called

        events = (await h.call("GET", "/audit?limit=1000")).json()
        mine = [e for e in events if e["request_id"] == "req-audit"]
        assert {e["action"] for e in mine} == set(EXPECTED)
        for e in mine:
            has_before, has_after = EXPECTED[e["action"]]
            if has_before is not None:
                assert (e["before"] is not None) == has_before, e
            assert (e["after"] is not None) == has_after, e
            assert e["actor"].startswith("key:") and e["client_addr"] == "203.0.113.7"
            for hidden in ("key_hash", "secret_sealed", "secret"):
                assert hidden not in (e["before"] or {}) and hidden not in (e["after"] or {})
        update = next(e for e in mine if e["action"] == "tenant.update")
        assert update["before"]["tier"] == "standard" and update["after"]["tier"] == "batch"
        second_put = [e for e in mine if e["action"] == "quota.put"]
        assert any(
            e["before"] and e["before"]["requests_per_minute"] == 5
            and e["after"]["requests_per_minute"] == 7
            for e in second_put
        )  # fmt: skip
        # filters
        only = (await h.call("GET", f"/audit?action=key.revoke&tenant_id={tid}")).json()
        assert [e["action"] for e in only] == ["key.revoke"]

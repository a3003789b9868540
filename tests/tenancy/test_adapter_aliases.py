"""Adapter versions and aliases through the admin API (issue 44, item 2): each upload of a name
is its next version; the alias moves with it unless the upload stages it; switch, canary,
rollback; a version an alias points at cannot be deleted (409 naming the alias) unless it is
the name's only one (the alias goes with it); a name goes with its alias and versions at once;
ids are never reused; a version's price carries over; tenants reach only their own versions."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from admin_harness import Harness, admin_harness
from tenancy_factories import SecretRegistry

from gateway.demo.adapters import demo_adapter_files
from tenancy.settings import TenancySettings


async def _tenant(h: Harness, name: str) -> str:
    return str((await h.call("POST", "/tenants", json={"name": name})).json()["id"])


async def _key(h: Harness, tenant_id: str, scopes: list[str], registry: SecretRegistry) -> str:
    r = await h.call("POST", f"/tenants/{tenant_id}/keys", json={"name": "k", "scopes": scopes})
    return registry.add(str(r.json()["key"]))


async def _upload(
    h: Harness, path: str, name: str, seed: int, key: str | None = None, **form: str
) -> Any:
    files = demo_adapter_files(h.runtime.settings.base_model, seed=seed)
    return await h.call(
        "POST", path, key, data={"name": name, **form},
        files=[("files", (f.filename, f.data)) for f in files],
    )  # fmt: skip


async def test_versions_switch_canary_rollback_and_guarded_deletes(h: Harness) -> None:
    await _lifecycle(h)


@pytest.mark.postgres
async def test_the_same_on_postgres_and_concurrent_switches_serialize(
    make_settings: Callable[..., TenancySettings],
    postgres_url: str,
    secret_registry: SecretRegistry,
) -> None:
    async with admin_harness(make_settings(database_url=postgres_url)) as h:
        secret_registry.add(h.admin_key)
        await _lifecycle(h)
        tid = await _tenant(h, "racer")
        ids = [(await _upload(h, f"/tenants/{tid}/adapters", "hot", seed=s)).json()["id"]
               for s in (1, 2, 3)]  # fmt: skip
        alias = f"/tenants/{tid}/adapter-aliases/hot"
        switched = f"/audit?tenant_id={tid}&action=alias.switch"
        by_uploads = {e["id"] for e in (await h.call("GET", switched)).json()}
        wanted = [1 + i % 3 for i in range(24)]
        answers = await asyncio.gather(*(h.call("PUT", alias, json={"version": v}) for v in wanted))
        assert [a.status_code for a in answers] == [200] * len(wanted)
        final = (await h.call("GET", alias)).json()
        events = [e for e in (await h.call("GET", switched)).json() if e["id"] not in by_uploads]
        assert len(events) == len(wanted)
        # one after another (the row locked): each switch saw the state the one before it
        # left, so the befores are the first state and every after but the last
        befores = Counter(e["before"]["version_id"] for e in events)
        afters = Counter(e["after"]["version_id"] for e in events)
        assert befores == Counter([ids[2]]) + afters - Counter([final["version_id"]])


async def _lifecycle(h: Harness) -> None:
    tid = await _tenant(h, "acme")
    path, aliases = f"/tenants/{tid}/adapters", f"/tenants/{tid}/adapter-aliases"
    v1 = (await _upload(h, path, "support", seed=1)).json()
    r = await _upload(h, path, "support", seed=2)
    assert r.status_code == 201, r.text
    v2 = r.json()
    staged = (await _upload(h, path, "support", seed=3, activate="false")).json()
    assert (v1["version"], v2["version"], staged["version"]) == (1, 2, 3)
    assert len({v1["id"], v2["id"], staged["id"]}) == 3  # each version its own engine name
    listed = (await h.call("GET", f"{path}?name=support")).json()
    assert [a["version"] for a in listed] == [1, 2, 3]

    alias = (await h.call("GET", f"{aliases}/support")).json()
    assert alias["version"] == 2 and alias["version_id"] == v2["id"]  # moved by v2, not by v3
    assert alias["canary_version"] is None and alias["canary_weight"] == 0

    r = await h.call("PUT", f"{aliases}/support/canary", json={"version": 3, "weight": 10})
    assert r.status_code == 200, r.text
    assert (r.json()["canary_version"], r.json()["canary_weight"]) == (3, 10)
    for bad in ({"version": 3, "weight": 0}, {"version": 3, "weight": 100}):
        assert (await h.call("PUT", f"{aliases}/support/canary", json=bad)).status_code == 400
    r = await h.call("PUT", f"{aliases}/support/canary", json={"version": 2, "weight": 5})
    assert r.status_code == 400 and "serves already" in r.json()["error"]["message"]
    r = await h.call("PUT", f"{aliases}/support/canary", json={"version": 9, "weight": 5})
    assert r.status_code == 404

    # neither the alias's version nor its canary can go
    for held, role in ((v2, "its version"), (staged, "its canary")):
        r = await h.call("DELETE", f"{path}/{held['id']}")
        assert r.status_code == 409, r.text
        message = r.json()["error"]["message"]
        assert "alias 'support'" in message and role in message, message
    assert (await h.call("DELETE", f"{path}/{v1['id']}")).status_code == 204  # unused: goes

    r = await h.call("DELETE", f"{aliases}/support/canary")
    assert r.status_code == 200 and r.json()["canary_version"] is None
    r = await h.call("PUT", f"{aliases}/support", json={"version": 3})  # promote
    assert r.json()["version"] == 3
    r = await h.call("PUT", f"{aliases}/support", json={"version": 2})  # and roll back
    assert r.status_code == 200 and r.json()["version"] == 2
    assert (await h.call("PUT", f"{aliases}/support", json={"version": 1})).status_code == 404
    assert (await h.call("DELETE", f"{path}/{staged['id']}")).status_code == 204

    # the name's only version goes with its alias: nothing is left for the alias to serve
    assert (await h.call("DELETE", f"{path}/{v2['id']}")).status_code == 204
    assert (await h.call("GET", f"{aliases}/support")).status_code == 404
    assert (await h.call("GET", f"{path}?name=support")).json() == []

    events = (await h.call("GET", f"/audit?tenant_id={tid}&limit=100")).json()
    actions = [e["action"] for e in events if e["object_type"] == "adapter_alias"]
    assert sorted(set(actions)) == [
        "alias.canary_clear", "alias.canary_set", "alias.create", "alias.delete", "alias.switch",
    ]  # fmt: skip
    switch = next(e for e in events if e["action"] == "alias.switch")  # newest first: 3 -> 2
    assert switch["before"]["version_id"] == staged["id"]
    assert switch["after"]["version_id"] == v2["id"]


async def test_a_name_goes_at_once_and_ids_are_never_reused(h: Harness) -> None:
    tid = await _tenant(h, "acme")
    path, aliases = f"/tenants/{tid}/adapters", f"/tenants/{tid}/adapter-aliases"
    first = [(await _upload(h, path, "sql", seed=s)).json()["id"] for s in (1, 2)]
    # the alias alone: `sql` is a 404 from then on, its versions stay (deletable one by one)
    assert (await h.call("DELETE", f"{aliases}/sql")).status_code == 204
    assert len((await h.call("GET", f"{path}?name=sql")).json()) == 2
    assert (await h.call("PUT", f"{aliases}/sql", json={"version": 2})).status_code == 200
    r = await h.call("DELETE", f"{aliases}/sql?with_versions=true")
    assert r.status_code == 204
    assert (await h.call("GET", f"{path}?name=sql")).json() == []
    assert (await h.call("DELETE", f"{aliases}/sql?with_versions=true")).status_code == 404
    # the same name and the same weights again: version 1 anew, under an id never seen before
    again = (await _upload(h, path, "sql", seed=1)).json()
    assert again["version"] == 1 and again["id"] not in first
    assert (await h.call("GET", f"{aliases}/sql")).json()["version_id"] == again["id"]


async def test_a_new_version_keeps_the_price_of_the_one_before(h: Harness) -> None:
    tid = await _tenant(h, "acme")
    path = f"/tenants/{tid}/adapters"
    v1 = (await _upload(h, path, "priced", seed=1)).json()
    body = {"model": h.runtime.settings.base_model.name, "adapter_id": v1["id"],
            "prompt": "1.5", "completion": "3"}  # fmt: skip
    assert (await h.call("PUT", "/prices", json=body)).status_code == 200
    v2 = (await _upload(h, path, "priced", seed=2)).json()
    prices = {p["adapter_id"]: p for p in (await h.call("GET", "/prices")).json()}
    assert prices[v2["id"]]["prompt"] == prices[v1["id"]]["prompt"]
    assert prices[v2["id"]]["completion"] == prices[v1["id"]]["completion"]


async def test_tenants_reach_only_their_own_versions(
    h: Harness, secret_registry: SecretRegistry
) -> None:
    a, b = await _tenant(h, "a"), await _tenant(h, "b")
    ka = await _key(h, a, ["tenant-admin"], secret_registry)
    await _upload(h, f"/tenants/{a}/adapters", "mine", seed=1, key=ka)
    theirs = [(await _upload(h, f"/tenants/{b}/adapters", "theirs", seed=s)).json()
              for s in (1, 2)]  # fmt: skip
    await _upload(h, f"/tenants/{b}/adapters", "mine", seed=3)  # B's own "mine", versions 1
    await _upload(h, f"/tenants/{b}/adapters", "mine", seed=4)  # and 2
    own = f"/tenants/{a}/adapter-aliases"
    # A names B's version numbers: only A's own name and versions exist for A
    r = await h.call("PUT", f"{own}/mine", ka, json={"version": 2})
    assert r.status_code == 404
    r = await h.call("PUT", f"{own}/theirs", ka, json={"version": 1})
    assert r.status_code == 404
    r = await h.call("PUT", f"{own}/mine/canary", ka, json={"version": 2, "weight": 50})
    assert r.status_code == 404
    assert (await h.call("GET", f"{own}/mine", ka)).json()["version"] == 1
    # B's aliases and versions are not A's to see or change
    other = f"/tenants/{b}/adapter-aliases"
    assert (await h.call("GET", f"{other}/theirs", ka)).status_code == 404
    assert (await h.call("PUT", f"{other}/theirs", ka, json={"version": 1})).status_code == 404
    assert (await h.call("DELETE", f"{other}/theirs", ka)).status_code == 404
    r = await h.call("DELETE", f"/tenants/{a}/adapters/{theirs[0]['id']}", ka)
    assert r.status_code == 404
    assert (await h.call("GET", f"/tenants/{b}/adapters?name=theirs", ka)).status_code == 404
    # public aliases: a tenant admin reads them, only the admin changes them
    await _upload(h, "/adapters", "shared", seed=5)
    await _upload(h, "/adapters", "shared", seed=6, activate="false")
    assert (await h.call("GET", "/adapter-aliases/shared", ka)).json()["version"] == 1
    assert (await h.call("GET", f"{own}/shared", ka)).json()["owner_tenant_id"] is None
    r = await h.call("PUT", "/adapter-aliases/shared", ka, json={"version": 2})
    assert r.status_code == 403
    r = await h.call("PUT", "/adapter-aliases/shared", json={"version": 2})
    assert r.status_code == 200 and r.json()["version"] == 2
    # under A's own path, a public name is not A's to switch
    assert (await h.call("PUT", f"{own}/shared", ka, json={"version": 1})).status_code == 404
    # once A has a "shared" of its own, the public one is hidden from A, even without A's alias
    await _upload(h, f"/tenants/{a}/adapters", "shared", seed=7, key=ka)
    assert (await h.call("DELETE", f"{own}/shared", ka)).status_code == 204
    assert (await h.call("GET", f"{own}/shared", ka)).status_code == 404

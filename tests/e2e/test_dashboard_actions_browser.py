"""Issue 45, acceptance 1: every action of the dashboard that acts, in a real headless Chromium
against a real `loragate serve` (the world of tests/e2e/dashboard_world.py), at a desktop's
1280 px and a phone's 390 px in the same browser, as an admin and as a tenant-admin, each
checked against the admin API afterwards. Every new page is saved as a screenshot (with
UPDATE_DASHBOARD_SCREENSHOTS=1 also under docs/screenshots/, what docs/dashboard.md shows) and
must be readable at both widths. An adapter's alias is switched between its versions with the
form on the adapters page.

The module makes tenants of its own (the world's acme and globex are other modules' numbers),
and shares one browser across its tests.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import screenshot, start_chromium, wait_for
from dashboard_forms import (
    Shop,
    adapter_files,
    api,
    as_user,
    at,
    flash,
    keys_by_name,
    new_key,
    per_row,
    shots,
    submit,
)
from dashboard_pages import open_page
from dashboard_world import MODEL, World, chat, sdk
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

pytestmark = pytest.mark.browser
WIDTHS = (1280, 390)


@pytest.fixture(scope="module")
def shop(world: World) -> Shop:
    name = f"shop-{uuid.uuid4().hex[:6]}"
    r = world.gateway.admin("POST", "/tenants", json={"name": name, "tier": "standard"})
    assert r.status_code == 201, r.text
    tenant_id = r.json()["id"]
    world.gateway.tenant_ids.append(tenant_id)
    assert world.gateway.admin("PUT", f"/tenants/{tenant_id}/quotas", json={
        "requests_per_minute": 600, "tokens_per_minute": 100_000, "max_concurrent": 8,
        "daily_token_budget": 1_000_000, "monthly_token_budget": None}).status_code == 200  # fmt: skip
    return Shop(
        id=tenant_id, name=name, admin_key=new_key(world, tenant_id, "ops", ["tenant-admin"]),
        inference_key=new_key(world, tenant_id, "app", ["inference"]),
    )  # fmt: skip


@pytest.fixture(scope="module")
def d(chromium: tuple[str, str]) -> Iterator[webdriver.Chrome]:
    browser = start_chromium(*chromium)
    try:
        yield browser
    finally:
        browser.quit()


def test_admin_creates_suspends_and_reactivates_tenants(
    world: World, d: webdriver.Chrome, shop: Shop
) -> None:
    as_user(d, world, world.gateway.admin_key)
    made = []
    for width in WIDTHS:
        at(d, width)
        open_page(d, world, "/dashboard")
        name = f"made-{width}-{uuid.uuid4().hex[:4]}"
        d.find_element(By.ID, "tenant-name").send_keys(name)
        submit(d, "#create-tenant button")
        assert flash(d) == "Tenant created."
        assert d.find_element(By.TAG_NAME, "h1").text == name
        made.append(d.current_url.rsplit("/", 1)[1].split("?")[0])
        world.gateway.tenant_ids.append(made[-1])
    listed = {t["id"]: t for t in api(world, "/tenants")}
    assert all(listed[t]["status"] == "active" and listed[t]["tier"] == "standard" for t in made)
    # A bad name is refused in place, naming the field.
    open_page(d, world, "/dashboard")
    d.find_element(By.ID, "tenant-name").send_keys("no spaces")
    d.execute_script("document.getElementById('create-tenant').noValidate = true")
    submit(d, "#create-tenant button")
    assert "name:" in d.find_element(By.ID, "create-error").text
    screenshot(d, world.shots / "tenant-create-error.png", width=1280)

    for width, status in zip(WIDTHS, ("suspended", "active"), strict=True):
        at(d, width)
        open_page(d, world, f"/dashboard/tenants/{made[0]}")
        submit(d, "#tenant-status-button", confirm=status == "suspended")
        assert flash(d).startswith("Tenant suspended" if status == "suspended" else "Tenant re")
        assert api(world, f"/tenants/{made[0]}")["status"] == status
        if status == "suspended":
            shots(world, d, "tenant-suspended")
    # A tenant-admin has neither form.
    as_user(d, world, shop.admin_key)
    assert not d.find_elements(By.ID, "create-tenant")
    open_page(d, world, f"/dashboard/tenants/{shop.id}")
    assert not d.find_elements(By.ID, "tenant-status-button")


def _create_key(d: webdriver.Chrome, world: World, shop: Shop, name: str) -> str:
    open_page(d, world, f"/dashboard/tenants/{shop.id}/keys")
    d.find_element(By.ID, "key-name").send_keys(name)
    submit(d, "#create-key button")
    key = str(wait_for(d, lambda d: d.find_element(By.ID, "new-key-value").get_attribute("value")))
    world.gateway.secrets.append(key)
    return key


def test_keys_are_created_copied_rotated_and_revoked(
    world: World, d: webdriver.Chrome, shop: Shop
) -> None:
    origin = world.gateway.url
    d.execute_cdp_cmd("Browser.grantPermissions", {
        "origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})  # fmt: skip
    for user, key in (("tenant-admin", shop.admin_key), ("admin", world.gateway.admin_key)):
        as_user(d, world, key)
        for width in WIDTHS:
            at(d, width)
            name = f"{user}-{width}"
            new_key = _create_key(d, world, shop, name)
            assert new_key.startswith("lg_") and "/keys" in d.current_url
            d.find_element(By.ID, "copy-key").click()
            wait_for(d, lambda d: d.find_element(By.ID, "copy-status").text.startswith("Copied"))
            copied = d.execute_async_script(
                "navigator.clipboard.readText().then(arguments[0], () => arguments[0](''))"
            )
            assert copied == new_key
            if (user, width) == ("tenant-admin", 1280):
                shots(world, d, "key-created")
            # The API knows it by name, masked; the key itself works for inference.
            listed = keys_by_name(world, shop.id)[name]
            assert [k["last_four"] for k in listed] == [new_key[-4:]]
            r = httpx.get(origin + "/v1/models", headers={"authorization": f"Bearer {new_key}"})
            assert r.status_code == 200
            # Shown once: a reload is the keys page (no second key), which never shows it again.
            d.refresh()
            assert not d.find_elements(By.ID, "new-key-value")
            assert new_key not in d.page_source and new_key[3:-4] not in d.page_source
            assert len(keys_by_name(world, shop.id)[name]) == 1

            # Rotate: a new key is shown once; the old one is replaced (in its grace period).
            row = f'tr[data-key-id="{listed[0]["id"]}"]'
            submit(d, f'{row} button[data-action="rotate"]')
            rotated = str(wait_for(d, lambda d: d.find_element(
                By.ID, "new-key-value").get_attribute("value")))  # fmt: skip
            world.gateway.secrets.append(rotated)
            after = {k["id"]: k for k in keys_by_name(world, shop.id)[name]}
            assert after[listed[0]["id"]]["replaced_by_id"] in after
            assert rotated[-4:] in {k["last_four"] for k in after.values()} and rotated != new_key

            # Revoke the new one: confirmed, then gone from inference within seconds.
            new_id = after[listed[0]["id"]]["replaced_by_id"]
            open_page(d, world, f"/dashboard/tenants/{shop.id}/keys")
            submit(d, f'tr[data-key-id="{new_id}"] button[data-action="revoke"]', confirm=True)
            assert flash(d).startswith("Key revoked")
            revoked = {k["id"]: k for k in keys_by_name(world, shop.id)[name]}[new_id]
            assert revoked["revoked_at"] is not None
            status = d.find_element(By.CSS_SELECTOR, f'tr[data-key-id="{new_id}"]')
            assert status.get_attribute("data-status") == "revoked"
    at(d, 1280)
    shots(world, d, "keys")


def test_quotas_change_only_the_fields_edited(
    world: World, d: webdriver.Chrome, shop: Shop
) -> None:
    path = f"/tenants/{shop.id}/quotas"
    before = api(world, path)
    as_user(d, world, world.gateway.admin_key)
    for width, (field, value) in zip(WIDTHS, (("requests_per_minute", 450),
                                              ("daily_token_budget", 2_000_000)), strict=True):  # fmt: skip
        at(d, width)
        open_page(d, world, f"/dashboard/tenants/{shop.id}/quotas")
        box = d.find_element(By.ID, f"q-{field}")
        assert box.get_attribute("value") == str(before[field])  # pre-filled with the policy
        box.clear()
        box.send_keys(str(value))
        submit(d, "#quota-form button[type=submit]")
        assert flash(d) == "Limits saved."
        before[field] = value
        assert api(world, path) == before  # that field, and no other
    shots(world, d, "quotas")
    # A tenant-admin: the tenant's limits are read-only; a key's own limits are its to set.
    as_user(d, world, shop.admin_key)
    key_id = keys_by_name(world, shop.id)["app"][0]["id"]
    for width, concurrent in zip(WIDTHS, (4, 3), strict=True):
        at(d, width)
        open_page(d, world, f"/dashboard/tenants/{shop.id}/quotas")
        assert d.find_element(By.ID, "read-only").is_displayed()
        assert not d.find_element(By.ID, "q-max_concurrent").is_enabled()
        submit(d, f'#subjects a[href$="key_id={key_id}"]')
        box = d.find_element(By.ID, "q-max_concurrent")
        assert box.is_enabled()
        box.clear()
        box.send_keys(str(concurrent))
        submit(d, "#quota-form button[type=submit]")
        assert flash(d) == "Limits saved."
        key_policy = api(world, f"/tenants/{shop.id}/keys/{key_id}/quotas")
        assert key_policy["max_concurrent"] == concurrent
        # Not edited, and unlimited: the tenant's limit (a key's may not be wider).
        assert key_policy["requests_per_minute"] == before["requests_per_minute"]
        assert key_policy["monthly_token_budget"] is None  # the tenant has none either
    # Above the tenant's limit: the service's refusal, on the page.
    box = d.find_element(By.ID, "q-max_concurrent")
    box.clear()
    box.send_keys("99")
    submit(d, "#quota-form button[type=submit]")
    assert "cannot exceed" in d.find_element(By.ID, "form-error").text
    assert d.find_element(By.ID, "q-max_concurrent").get_attribute("value") == "99"  # kept
    assert api(world, f"/tenants/{shop.id}/keys/{key_id}/quotas")["max_concurrent"] == 3
    shots(world, d, "quotas-key")


# Records each value the upload's progress bar takes (the page sets it from XHR upload events).
WATCH_PROGRESS = """
window.seenProgress = [];
const bar = document.getElementById("upload-bar");
new MutationObserver(() => window.seenProgress.push(bar.getAttribute("value")))
  .observe(bar, {attributes: true, attributeFilter: ["value"]});
"""


def test_adapters_upload_with_progress_and_refusals_in_place(
    world: World, d: webdriver.Chrome, shop: Shop, tmp_path: Path, tiny_model_dir: Path
) -> None:
    good = adapter_files(tmp_path, tiny_model_dir, "good", rank=8)
    max_rank = api(world, "/adapters/limits")["max_rank"]
    too_wide = adapter_files(tmp_path, tiny_model_dir, "wide", rank=max_rank * 2)
    for user, key in (("ta", shop.admin_key), ("admin", world.gateway.admin_key)):
        as_user(d, world, key)
        for width in WIDTHS:
            at(d, width)
            open_page(d, world, f"/dashboard/tenants/{shop.id}/adapters")
            # Refused: the server's reason, beside the form, and nothing stored.
            d.find_element(By.ID, "adapter-name").send_keys(f"wide-{user}-{width}")
            d.find_element(By.ID, "adapter-files").send_keys("\n".join(too_wide))
            assert not d.find_element(By.ID, "upload-progress").is_displayed()
            d.execute_script(WATCH_PROGRESS)
            submit(d, "#upload-button", loads=False)
            error = wait_for(d, lambda d: d.find_element(By.ID, "upload-error").text)
            assert "rank" in str(error).lower(), error
            # The bar followed the upload's progress events to the end, then made way.
            seen = d.execute_script("return window.seenProgress")
            assert seen and seen[-1] == "100" and not d.find_element(
                By.ID, "upload-progress").is_displayed()  # fmt: skip
            if (user, width) == ("ta", 390):
                screenshot(d, world.shots / "adapters-refused-phone.png", width=390)
            # Accepted: the progress bar, then the list.
            name = f"bot-{user}-{width}"
            d.find_element(By.ID, "adapter-name").clear()
            d.find_element(By.ID, "adapter-name").send_keys(name)
            d.find_element(By.ID, "adapter-files").clear()
            d.find_element(By.ID, "adapter-files").send_keys("\n".join(good))
            submit(d, "#upload-button", loads=False)
            assert flash(d) == "Adapter uploaded."
            assert name in d.find_element(By.ID, "adapters").text
    names = {a["name"] for a in api(world, f"/tenants/{shop.id}/adapters")}
    assert {f"bot-{u}-{w}" for u in ("ta", "admin") for w in WIDTHS} <= names
    assert not any(n.startswith("wide-") for n in names)
    at(d, 1280)
    open_page(d, world, f"/dashboard/tenants/{shop.id}/adapters")
    shots(world, d, "adapters")


def test_an_alias_is_switched_between_versions(
    world: World, d: webdriver.Chrome, shop: Shop, tmp_path: Path, tiny_model_dir: Path
) -> None:
    files = adapter_files(tmp_path, tiny_model_dir, "versions", rank=8)
    for _ in range(2):  # versions 1 and 2 of one name; the alias follows the second
        r = world.gateway.admin(
            "POST", f"/tenants/{shop.id}/adapters", data={"name": "switched"},
            files=[("files", (Path(f).name, Path(f).read_bytes())) for f in files],
        )  # fmt: skip
        assert r.status_code == 201, r.text
    alias = f"/tenants/{shop.id}/adapter-aliases/switched"
    for (user, key), width, version in zip(
        (("ta", shop.admin_key), ("admin", world.gateway.admin_key)), WIDTHS, (1, 2), strict=True
    ):
        as_user(d, world, key)
        at(d, width)
        open_page(d, world, f"/dashboard/tenants/{shop.id}/adapters")
        Select(d.find_element(By.ID, "switch-switched")).select_by_value(str(version))
        submit(d, '[data-alias="switched"] [data-action="switch"]')
        assert flash(d).startswith("Alias switched"), user
        row = d.find_element(By.CSS_SELECTOR, '[data-alias="switched"]').text
        assert str(version) in row
        assert api(world, alias)["version"] == version
    at(d, 1280)
    shots(world, d, "adapters-aliases")


def test_usage_over_a_time_range_per_key_and_per_model(
    world: World, d: webdriver.Chrome, shop: Shop
) -> None:
    second = new_key(world, shop.id, "batch", ["inference"])
    for key, n in ((shop.inference_key, 2), (second, 1)):
        for i in range(n):
            chat(sdk(world.gateway, key), MODEL, f"Usage page request {i}.", 5)
    today = dt.datetime.now(dt.UTC).date()
    rows: list[dict[str, Any]] = []
    for _ in range(100):  # the usage writer flushes every 50 ms here
        rows = api(world, f"/tenants/{shop.id}/usage")
        if sum(r["num_requests"] for r in rows) >= 3:
            break
        time.sleep(0.1)
    ledger = {r["model"]: (r["num_requests"], r["prompt_tokens"] + r["completion_tokens"])
              for r in rows}  # fmt: skip
    keys = {k["name"]: k["id"] for k in api(world, f"/tenants/{shop.id}/keys")}
    yesterday = today - dt.timedelta(days=1)
    for user, key in (("ta", shop.admin_key), ("admin", world.gateway.admin_key)):
        as_user(d, world, key)
        # A preset at each width (both hold today), then custom dates: yesterday only holds
        # none of it, today holds all of it.
        for width, preset, day, expected in ((1280, "24h", yesterday, {}), (390, "30d", today, ledger)):  # fmt: skip
            at(d, width)
            open_page(d, world, f"/dashboard/tenants/{shop.id}/usage")
            submit(d, f'#presets a[data-range="{preset}"]')
            assert f"range={preset}" in d.current_url
            assert per_row(d, "per-model", "data-model") == ledger
            per_key = per_row(d, "per-key", "data-key-id")
            assert per_key[keys["app"]][0] == 2 and per_key[keys["batch"]][0] == 1
            assert sum(t for _, t in per_key.values()) == sum(t for _, t in ledger.values())
            if (user, width) == ("ta", 1280):
                shots(world, d, "usage")
            for field in ("range-from", "range-to"):
                d.execute_script("arguments[0].value = arguments[1]",
                                 d.find_element(By.ID, field), day.isoformat())  # fmt: skip
            submit(d, "#custom-range button")
            assert f"from={day.isoformat()}" in d.current_url
            assert per_row(d, "per-model", "data-model") == expected
    # A backwards range is refused in place, naming the field.
    open_page(d, world, f"/dashboard/tenants/{shop.id}/usage?range=custom&from={today}&to="
              f"{today - dt.timedelta(days=3)}")  # fmt: skip
    assert d.find_element(By.ID, "range-error").text.startswith("from:")


def test_audit_log_filters_and_csv_export(world: World, d: webdriver.Chrome, shop: Shop) -> None:
    for user, key in (("ta", shop.admin_key), ("admin", world.gateway.admin_key)):
        as_user(d, world, key)
        for width, action in ((1280, "key.revoke"), (390, "key.rotate")):
            at(d, width)
            open_page(d, world, "/dashboard/audit")
            if user == "admin":  # an admin picks the tenant; a tenant-admin has only its own
                d.find_element(By.CSS_SELECTOR, f'#f-tenant option[value="{shop.id}"]').click()
            else:
                assert not d.find_elements(By.ID, "f-tenant")
            d.find_element(By.CSS_SELECTOR, f'#f-action option[value="{action}"]').click()
            submit(d, "#audit-filter button[type=submit]")
            assert f"action={action}" in d.current_url
            shown = [r.get_attribute("data-object-id")
                     for r in d.find_elements(By.CSS_SELECTOR, "#events tbody tr[data-action]")]  # fmt: skip
            expected = [e["object_id"] for e in api(world, "/audit", tenant_id=shop.id,
                                                     action=action)]  # fmt: skip
            assert shown == expected and len(shown) >= 4  # the keys test did each four times
            if (user, width) == ("ta", 1280):
                shots(world, d, "audit")
            # The export: the same filter, as an attachment.
            href = d.find_element(By.ID, "csv-export").get_attribute("href")
            got = d.execute_async_script(
                "fetch(arguments[0]).then(r => r.text().then(t => arguments[1]("
                "[r.headers.get('content-disposition'), t])))",
                href,
            )
            assert got[0].startswith("attachment;")
            rows = list(csv.DictReader(io.StringIO(got[1])))
            assert [r["object_id"] for r in rows] == expected
            field = "revoked_at" if action == "key.revoke" else "rotation_grace_until"
            assert all(json.loads(r["after"])[field] for r in rows)

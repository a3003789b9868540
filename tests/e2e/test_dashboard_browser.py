"""Issue 11, acceptance 1 and 3: the dashboard's pages in a real headless Chromium, against a
real `loragate serve` process, after real requests through the OpenAI SDK (the world in
tests/e2e/dashboard_world.py).

- A tenant-admin logs in with its key and sees only its tenant; the page's used / limit /
  remaining numbers equal the quota-state API's, its usage charts equal the usage ledger's, and
  the live state follows a new rejection without a reload.
- An admin sees every tenant, the engines page and the API docs.
- Every page is saved as a screenshot (desktop 1280 px, and a phone's 390 px) under the
  test's directory; with UPDATE_DASHBOARD_SCREENSHOTS=1 also under docs/screenshots/ (what
  docs/dashboard.md shows).

Refused logins and SSO are in test_dashboard_browser_auth.py.
"""

from __future__ import annotations

import openai
import pytest
from browser import screenshot, wait_for
from dashboard_pages import (
    api_state,
    chart_series,
    log_in,
    no_key_on_page,
    number,
    open_page,
    page_limits,
    readable,
)
from dashboard_world import MODEL, RPM, World, chat, ledger_rows, sdk
from selenium import webdriver
from selenium.webdriver.common.by import By

pytestmark = pytest.mark.browser


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
    for row in ledger_rows(world.gateway, acme):
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
        chat(sdk(world.gateway, acme.inference_key), MODEL, "Still over the limit.", 4)
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
    # Read before and after the page: a per-minute window may roll over in between (a slow
    # machine), and then the page agrees with one of the two reads, limit by limit.
    before = {r["name"]: r["used"] for r in api_state(world, world.globex)["limits"]}
    open_page(d, world, f"/dashboard/tenants/{world.globex.id}")
    shown = page_limits(d)
    after = {r["name"]: r["used"] for r in api_state(world, world.globex)["limits"]}
    assert set(shown) == set(before) == set(after)
    for name, limit in shown.items():
        assert limit["used"] in (before[name], after[name]), name
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

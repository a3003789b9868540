"""Reading the dashboard's pages in the browser: logging in (with a key or through SSO), the
numbers a page shows (limits, chart series) and the checks every page must pass (no key text,
readable at desktop and phone widths)."""

from __future__ import annotations

from typing import Any

from browser import layout_problems
from dashboard_world import Tenant, World
from selenium import webdriver
from selenium.webdriver.common.by import By


def open_page(d: webdriver.Chrome, world: World, path: str) -> None:
    d.get(world.gateway.url + path)


def log_in(d: webdriver.Chrome, world: World, key: str) -> None:
    open_page(d, world, "/dashboard/login")
    field = d.find_element(By.ID, "key")
    assert d.find_element(By.CSS_SELECTOR, 'label[for="key"]').text  # a labelled field
    field.send_keys(key)
    d.find_element(By.CSS_SELECTOR, 'form[action="/dashboard/login"] button[type="submit"]').click()


def sso(d: webdriver.Chrome, world: World) -> None:
    d.delete_all_cookies()
    open_page(d, world, "/dashboard/login")
    d.find_element(By.LINK_TEXT, "Sign in with SSO").click()


def number(text: str) -> int | None:
    text = text.strip()
    return None if text in ("∞", "—") else int(text.replace(",", ""))


def page_limits(d: webdriver.Chrome, scope: str = "#live") -> dict[str, dict[str, int | None]]:
    rows = {}
    for row in d.find_elements(By.CSS_SELECTOR, f"{scope} tr[data-limit]"):
        cells = {f: row.find_element(By.CSS_SELECTOR, f'[data-field="{f}"]').text
                 for f in ("used", "limit", "remaining")}  # fmt: skip
        rows[row.get_attribute("data-limit") or ""] = {k: number(v) for k, v in cells.items()}
    return rows


def api_state(world: World, tenant: Tenant) -> dict[str, Any]:
    r = world.gateway.admin("GET", f"/tenants/{tenant.id}/quota-state")
    assert r.status_code == 200, r.text
    state: dict[str, Any] = r.json()
    return state


def no_key_on_page(d: webdriver.Chrome, world: World) -> None:
    source = d.page_source
    for tenant in (world.acme, world.globex):
        for key in (tenant.inference_key, tenant.admin_key):
            assert key not in source and key[3:-4] not in source
    assert world.gateway.admin_key not in source


def chart_series(d: webdriver.Chrome, chart_id: str) -> dict[str, int]:
    figure = d.find_element(By.CSS_SELECTOR, f'figure[aria-labelledby="{chart_id}-title"]')
    return {
        row.get_attribute("data-series") or "": int(
            row.find_element(By.CSS_SELECTOR, "td[data-tokens]").get_attribute("data-tokens") or 0
        )
        for row in figure.find_elements(By.CSS_SELECTOR, "table.legend tbody tr")
    }


def readable(d: webdriver.Chrome) -> None:
    """Readable at 1280 px and on a phone (390 px): nothing cut off, chart labels big enough."""
    for width in (1280, 390):
        assert layout_problems(d, width=width) == [], (d.current_url, width)

"""Driving the dashboard's forms in the browser for tests/e2e/test_dashboard_actions_browser.py:
logging in as someone, a window width, submitting a form (and accepting its confirmation), the
message after a redirect, the admin API's answer to compare with, and the files of an adapter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from browser import screenshot, wait_for
from dashboard_pages import open_page, readable
from dashboard_world import MODEL, World
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions

from gateway.demo.adapters import demo_adapter_files
from tenancy.adapters.base_model import base_model_spec


@dataclass
class Shop:
    """A tenant of this module's: its id, a tenant-admin key and an inference key."""

    id: str
    name: str
    admin_key: str
    inference_key: str


def new_key(world: World, tenant_id: str, name: str, scopes: list[str]) -> str:
    r = world.gateway.admin("POST", f"/tenants/{tenant_id}/keys",
                            json={"name": name, "scopes": scopes})  # fmt: skip
    assert r.status_code == 201, r.text
    world.gateway.secrets.append(r.json()["key"])
    return str(r.json()["key"])


def as_user(d: webdriver.Chrome, world: World, key: str) -> None:
    d.delete_all_cookies()
    open_page(d, world, "/dashboard/login")
    d.find_element(By.ID, "key").send_keys(key)
    d.find_element(By.CSS_SELECTOR, 'form[action="/dashboard/login"] button').click()
    wait_for(d, lambda d: d.current_url.endswith("/dashboard"))
    loaded(d)


def at(d: webdriver.Chrome, width: int) -> None:
    d.set_window_size(width, 900)


def _left(page: WebElement) -> Callable[[webdriver.Chrome], bool]:
    """True once `page` (the old document's root) is gone: stale, or, while the next document
    replaces it, a node Chromium no longer finds in the document (another error)."""

    def gone(_: webdriver.Chrome) -> bool:
        try:
            page.is_enabled()
        except WebDriverException:  # StaleElementReferenceException is one
            return True
        return False

    return gone


def loaded(d: webdriver.Chrome) -> None:
    wait_for(d, lambda d: d.execute_script("return document.readyState") == "complete")


def submit(d: webdriver.Chrome, css: str, *, confirm: bool = False, loads: bool = True) -> None:
    """Click a form's button or a link (and accept its confirmation); with `loads`, wait for
    the answer to replace the page."""
    page = d.find_element(By.TAG_NAME, "html")
    d.find_element(By.CSS_SELECTOR, css).click()
    if confirm:
        wait_for(d, expected_conditions.alert_is_present())
        d.switch_to.alert.accept()
    if loads:
        wait_for(d, _left(page))
        loaded(d)


def flash(d: webdriver.Chrome) -> str:
    loaded(d)
    return str(wait_for(d, lambda d: d.find_element(By.ID, "flash").text))


def api(world: World, path: str, **params: Any) -> Any:
    r = world.gateway.admin("GET", path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def shots(world: World, d: webdriver.Chrome, name: str) -> None:
    """The page at both widths, and readable at both."""
    screenshot(d, world.shots / f"{name}.png")
    screenshot(d, world.shots / f"{name}-phone.png", width=390)
    readable(d)


def keys_by_name(world: World, tenant_id: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for key in api(world, f"/tenants/{tenant_id}/keys"):
        out.setdefault(key["name"], []).append(key)
    return out


def adapter_files(
    tmp: Path, model_dir: Path, name: str, rank: int, *, model: str = MODEL
) -> list[str]:
    """The files of a PEFT adapter of `model` (its checkpoint at `model_dir`), under tmp/name."""
    spec = base_model_spec(model_dir, model)
    folder = tmp / name
    folder.mkdir()
    paths = []
    for f in demo_adapter_files(spec, seed=5, rank=rank):
        (folder / f.filename).write_bytes(f.data)
        paths.append(str(folder / f.filename))
    return paths


def per_row(d: webdriver.Chrome, table: str, attr: str) -> dict[str, tuple[int, int]]:
    return {
        str(row.get_attribute(attr)): (int(row.get_attribute("data-requests") or 0),
                                       int(row.get_attribute("data-tokens") or 0))
        for row in d.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[{attr}]")
    }  # fmt: skip

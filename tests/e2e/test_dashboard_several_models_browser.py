"""The dashboard's adapters page on a gateway with several base models, in a real headless
Chromium against a real `loragate serve` (tiny the primary model, small in LORAGATE_MODELS: the
world of tests/e2e/dashboard_world.py on those settings). An admin chooses the base model an
upload is for; an adapter of small uploaded for small is listed with its base model and serves
a tenant's chat on small's engine; an adapter of tiny uploaded for small is refused beside the
form, with the API's message naming what did not fit. With one model there is no choice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import screenshot, wait_for
from dashboard_forms import adapter_files, api, as_user, at, flash, shots, submit
from dashboard_pages import open_page
from dashboard_world import MODEL, World, open_world, sdk
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

pytestmark = pytest.mark.browser
SMALL = "small"
# A token id in small's vocabulary (16384) and not in tiny's (4096): only small's engine takes it.
SMALL_ONLY_TOKEN = 10_000


@pytest.fixture(scope="module")
def two_models(
    chromium: tuple[str, str],
    model_factory: Any,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    models = [{"name": SMALL, "path": str(model_factory(size=SMALL)),
               "engine": {"num_kv_blocks": 256}}]  # fmt: skip
    workdir = tmp_path_factory.mktemp("dashboard-several-models")
    with open_world(tiny_model_dir, workdir, LORAGATE_MODELS=json.dumps(models)) as opened:
        yield opened


def _base_models_listed(d: webdriver.Chrome) -> dict[str, str]:
    """Adapter name -> the base model its row shows."""
    out = {}
    for row in d.find_elements(By.CSS_SELECTOR, "#adapters tbody tr[data-adapter-id]"):
        cell = row.find_element(By.CSS_SELECTOR, 'td[data-label="Base model"]')
        out[row.find_element(By.TAG_NAME, "th").text] = cell.text
    return out


def _fill_upload(d: webdriver.Chrome, name: str, base_model: str, files: list[str]) -> None:
    for field, value in (("adapter-name", name), ("adapter-files", "\n".join(files))):
        d.find_element(By.ID, field).clear()
        d.find_element(By.ID, field).send_keys(value)
    Select(d.find_element(By.ID, "adapter-base-model")).select_by_value(base_model)


def test_an_adapter_is_uploaded_for_the_base_model_chosen_and_serves_on_it(
    two_models: World, driver: webdriver.Chrome, model_factory: Any, tmp_path: Path
) -> None:
    world, d, tenant = two_models, driver, two_models.globex
    small_files = adapter_files(tmp_path, model_factory(size=SMALL), "small", 8, model=SMALL)
    tiny_files = adapter_files(tmp_path, model_factory(), "tiny", 8)
    as_user(d, world, world.gateway.admin_key)
    at(d, 1280)
    open_page(d, world, f"/dashboard/tenants/{tenant.id}/adapters")
    choice = Select(d.find_element(By.ID, "adapter-base-model"))
    assert [o.get_attribute("value") for o in choice.options] == [MODEL, SMALL]
    assert choice.first_selected_option.get_attribute("value") == MODEL  # the primary
    assert _base_models_listed(d) == {"globex-private": MODEL}  # the world's, on tiny

    # tiny's adapter uploaded for small: refused beside the form, naming both models.
    _fill_upload(d, "tiny-on-small", SMALL, tiny_files)
    submit(d, "#upload-button", loads=False)
    error = str(wait_for(d, lambda d: d.find_element(By.ID, "upload-error").text))
    assert error.startswith("base_model_name_or_path:"), error
    assert f"'{MODEL}'" in error and f"'{SMALL}'" in error, error
    assert d.find_element(By.ID, "adapter-name").get_attribute("value") == "tiny-on-small"
    screenshot(d, world.shots / "adapters-several-models-refused.png")

    _fill_upload(d, "small-bot", SMALL, small_files)
    submit(d, "#upload-button", loads=False)
    assert flash(d) == "Adapter uploaded."
    assert _base_models_listed(d) == {"globex-private": MODEL, "small-bot": SMALL}
    shots(world, d, "adapters-several-models")
    stored = {a["name"]: a["base_model"] for a in api(world, f"/tenants/{tenant.id}/adapters")}
    assert stored == {"globex-private": MODEL, "small-bot": SMALL}  # nothing of the refusal

    # The tenant's key: the adapter answers a chat, and small's engine is the one serving it.
    answer = sdk(world.gateway, tenant.inference_key).chat.completions.create(
        model="small-bot", messages=[{"role": "user", "content": "Hello"}], max_tokens=4,
        temperature=0,
    )  # fmt: skip
    assert answer.model == "small-bot" and answer.choices[0].message.content is not None
    headers = {"authorization": f"Bearer {tenant.inference_key}"}
    with httpx.Client(base_url=world.gateway.url, headers=headers, timeout=120) as client:
        listed = {m["id"]: m["parent"] for m in client.get("/v1/models").json()["data"]}
        assert listed["small-bot"] == SMALL
        body = {"model": "small-bot", "token_ids": [SMALL_ONLY_TOKEN, 3],
                "sampling_params": {"max_tokens": 2}}  # fmt: skip
        r = client.post("/inference/v1/generate", json=body)
        assert r.status_code == 200, r.text


def test_one_base_model_offers_no_choice(world: World, driver: webdriver.Chrome) -> None:
    as_user(driver, world, world.gateway.admin_key)
    open_page(driver, world, f"/dashboard/tenants/{world.globex.id}/adapters")
    assert driver.find_element(By.ID, "upload-form").is_displayed()
    assert not driver.find_elements(By.ID, "adapter-base-model")
    header = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#adapters thead th")]
    assert "Name" in header and "Base model" not in header

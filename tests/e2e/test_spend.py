"""Issue 45, item 2 (acceptance): prices set, requests made through the `openai` SDK on the base
model and on an adapter (with two keys), and the spend that the admin API, the CLI and the
dashboard show equals the ledger's tokens times the prices, to the cent. A key's currency budget
refuses exactly at its bound (the in-process store here; four gateways on Redis in
tests/chaos/test_spend_budget.py)."""

from __future__ import annotations

import json
import re
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_process import GatewayProcess

from gateway.cli import main
from gateway.demo.adapters import demo_adapter_files
from tenancy.adapters.base_model import base_model_spec

MODEL = "tiny"
BASE_PRICE = {"prompt": "1234.567891", "cached": "617.283945", "completion": "3456.789012"}
ADAPTER_PRICE = {"prompt": "2000.000001", "completion": "5000"}  # cached: the prompt price
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
pytestmark = pytest.mark.parametrize("gateway_proc", ["embedded"], indirect=True)


def _exact_cost(price: dict[str, str], row: dict[str, int]) -> Decimal:
    """Tokens times prices per 1M, in the currency, unrounded."""
    cached = Decimal(price.get("cached", price["prompt"]))
    return (
        (row["prompt_tokens"] - row["cached_tokens"]) * Decimal(price["prompt"])
        + row["cached_tokens"] * cached
        + row["completion_tokens"] * Decimal(price["completion"])
    ) / 1_000_000


def _ledger_by_model(gw: GatewayProcess, tenant_id: str, num_requests: int) -> dict[str, Any]:
    """The ledger's tokens per model (the usage report), once every request is in it."""
    deadline = time.monotonic() + 30
    while True:
        rows = gw.admin("GET", f"/tenants/{tenant_id}/usage").json()
        if sum(r["num_requests"] for r in rows) >= num_requests or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    by_model: dict[str, dict[str, int]] = {}
    for row in rows:
        totals = by_model.setdefault(row["model"], dict.fromkeys(
            ("num_requests", "prompt_tokens", "cached_tokens", "completion_tokens"), 0))  # fmt: skip
        for field in totals:
            totals[field] += row[field]
    return by_model


def _cli(gw: GatewayProcess, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main(["admin", *argv]) == 0
    return capsys.readouterr().out


def _dashboard_page(gw: GatewayProcess, path: str) -> str:
    with httpx.Client(base_url=gw.url, timeout=30) as browser:
        form = browser.get("/dashboard/login")
        token = CSRF.search(form.text)
        assert token is not None
        r = browser.post("/dashboard/login", data={"key": gw.admin_key, "csrf_token": token[1]})
        assert r.status_code in (200, 303), r.text
        page = browser.get(path)
        assert page.status_code == 200, page.text
        return page.text


def test_spend_is_the_ledgers_tokens_times_the_prices(
    gateway_proc: GatewayProcess,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gw = gateway_proc
    tenant = gw.tenant()
    second = gw.admin("POST", f"/tenants/{tenant.tenant_id}/keys", json={"name": "second"}).json()
    gw.secrets.append(second["key"])
    files = demo_adapter_files(base_model_spec(tiny_model_dir, MODEL), seed=7)
    adapter_id = gw.upload_adapter(
        tenant.tenant_id, "spend-lora", [(f.filename, f.data) for f in files]
    )
    r = gw.admin("PUT", "/prices", json={"model": MODEL, **BASE_PRICE})
    assert r.status_code == 200 and r.json()["cached_micros_per_mtok"] == 617_283_945, r.text
    r = gw.admin("PUT", "/prices", json={"model": MODEL, "adapter_id": adapter_id, **ADAPTER_PRICE})
    assert r.status_code == 200 and r.json()["cached"] == "2000.000001", r.text
    prices = {MODEL: BASE_PRICE, "spend-lora": ADAPTER_PRICE}

    for key in (tenant.key, second["key"]):
        client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
        for model in prices:
            for n in (5, 9):  # the same prompt twice: the second may read it from the cache
                reply = client.chat.completions.create(
                    model=model, max_tokens=n, temperature=0, extra_body={"ignore_eos": True},
                    messages=[{"role": "user", "content": "What does this cost? " * 8}],
                )  # fmt: skip
                assert reply.usage is not None and reply.usage.completion_tokens == n

    ledger = _ledger_by_model(gw, tenant.tenant_id, 8)
    assert {m: t["num_requests"] for m, t in ledger.items()} == {MODEL: 4, "spend-lora": 4}
    assert ledger[MODEL]["cached_tokens"] > 0  # the cached price is part of what is checked
    expected = {m: _exact_cost(prices[m], tokens) for m, tokens in ledger.items()}
    report = gw.admin("GET", f"/tenants/{tenant.tenant_id}/spend").json()
    for row in report["by_model"]:
        cost = Decimal(row["cost"])
        assert abs(cost - expected[row["model"]]) < Decimal("0.005"), row  # to the cent
        # exactly: each request's cost rounded up once, to the micro-unit
        exact_micros = expected[row["model"]] * 1_000_000
        assert exact_micros <= row["cost_micros"] < exact_micros + row["num_requests"], row
    total = report["total"]
    assert abs(Decimal(total["cost"]) - sum(expected.values())) < Decimal("0.005")
    assert total["cost_micros"] == sum(r["cost_micros"] for r in report["by_model"])
    assert total["cost_micros"] == sum(r["cost_micros"] for r in report["by_key"])
    assert {r["api_key_id"] for r in report["by_key"]} == {second["id"], _key_id(gw, tenant)}
    assert [r["tenant_id"] for r in gw.admin("GET", "/spend").json()].count(tenant.tenant_id) == 1

    monkeypatch.setenv("LORAGATE_ADMIN_URL", gw.url)
    monkeypatch.setenv("LORAGATE_ADMIN_KEY", gw.admin_key)
    monkeypatch.setenv("COLUMNS", "200")
    assert json.loads(_cli(gw, capsys, "spend", tenant.tenant_id, "--json")) == report
    table = _cli(gw, capsys, "spend", tenant.tenant_id)
    assert total["cost"] in table and report["by_model"][0]["cost"] in table

    page = _dashboard_page(gw, f"/dashboard/tenants/{tenant.tenant_id}")
    assert f'data-micros="{total["cost_micros"]}">{total["cost"]} USD<' in page
    for row in report["by_model"]:
        assert f'data-field="cost">{row["cost"]}<' in page


def _key_id(gw: GatewayProcess, tenant: Any) -> str:
    keys = gw.admin("GET", f"/tenants/{tenant.tenant_id}/keys").json()
    return str(next(k["id"] for k in keys if k["name"] == "k"))


def test_a_keys_currency_budget_refuses_exactly_at_its_bound(
    gateway_proc: GatewayProcess, tiny_model_dir: Path
) -> None:
    """A price without a cached discount and ignore_eos: each request costs exactly what
    admission reserves, so a budget of three requests' cost admits three and refuses the fourth."""
    gw = gateway_proc
    tenant = gw.tenant()
    files = demo_adapter_files(base_model_spec(tiny_model_dir, MODEL), seed=8)
    adapter_id = gw.upload_adapter(
        tenant.tenant_id, "budget-lora", [(f.filename, f.data) for f in files]
    )
    price = {"prompt": "3000", "completion": "7000.5"}
    assert (
        gw.admin(
            "PUT", "/prices", json={"model": MODEL, "adapter_id": adapter_id, **price}
        ).status_code
        == 200
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key=tenant.key, max_retries=0)

    def ask() -> Any:
        return client.chat.completions.create(
            model="budget-lora", max_tokens=7, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": "Spend it."}],
        )  # fmt: skip

    first = ask()
    assert first.usage is not None
    cost = -(-(first.usage.prompt_tokens * 3000_000_000 + 7 * 7000_500_000) // 1_000_000)
    key = gw.admin("POST", f"/tenants/{tenant.tenant_id}/keys", json={"name": "capped"}).json()
    gw.secrets.append(key["key"])
    r = gw.admin("PUT", f"/tenants/{tenant.tenant_id}/keys/{key['id']}/quotas",
                 json={"daily_spend_budget_micros": 3 * cost})  # fmt: skip
    assert r.status_code == 200, r.text
    client = openai.OpenAI(base_url=gw.base_url, api_key=key["key"], max_retries=0)
    for _ in range(3):
        ask()
    with pytest.raises(openai.RateLimitError) as info:
        ask()
    assert info.value.code == "insufficient_quota"
    assert "daily_spend_budget_micros" in info.value.message
    state = gw.admin("GET", f"/tenants/{tenant.tenant_id}/keys/{key['id']}/quota-state").json()
    row = next(r for r in state["limits"] if r["name"] == "daily_spend_budget_micros")
    assert (row["used"], row["remaining"]) == (3 * cost, 0)

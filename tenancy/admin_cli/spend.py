"""`loragate admin prices list|set` and `loragate admin spend [TENANT]`: prices per 1M tokens and
spend read from the usage ledger, through the admin REST API. Amounts print as the API sends
them: decimal strings of the currency, exact (the micro-units are in `--json`)."""

from __future__ import annotations

import argparse

from tenancy.admin_cli import render
from tenancy.admin_cli.client import AdminClient

PRICE = [("model", "model"), ("adapter_id", "adapter"), ("prompt", "prompt /1M"),
         ("cached", "cached /1M"), ("completion", "completion /1M"), ("currency", "currency"),
         ("source", "source")]  # fmt: skip
_TOKENS = [("num_requests", "requests"), ("prompt_tokens", "prompt"),
           ("cached_tokens", "cached"), ("completion_tokens", "completion"), ("cost", "spend")]  # fmt: skip
BY_TENANT = [("tenant_id", "tenant"), *_TOKENS]
BY_KEY = [("api_key_id", "key"), *_TOKENS]
BY_MODEL = [("model", "model"), ("adapter_id", "adapter"), *_TOKENS]


def prices_list(c: AdminClient, a: argparse.Namespace) -> None:
    prices = c.call("GET", "/prices")
    if a.json:
        render.as_json(prices)
    else:
        render.table(prices, PRICE)


def prices_set(c: AdminClient, a: argparse.Namespace) -> None:
    body = {"model": a.model, "adapter_id": a.adapter, "prompt": a.prompt,
            "cached": a.cached, "completion": a.completion}  # fmt: skip
    price = c.call("PUT", "/prices", json=body)
    if a.json:
        render.as_json(price)
    else:
        render.record(price, PRICE)


def spend(c: AdminClient, a: argparse.Namespace) -> None:
    """A tenant's total, per key and per model; without TENANT, every tenant you may see."""
    params = {"since": a.since, "until": a.until}
    if not a.tenant:
        rows = c.call("GET", "/spend", params=params)
        if a.json:
            render.as_json(rows)
        else:
            render.table(rows, BY_TENANT)
        return
    report = c.call("GET", f"/tenants/{a.tenant}/spend", params=params)
    if a.json:
        render.as_json(report)
        return
    currency = report["currency"]
    render.table([report["total"]], BY_TENANT, title=f"Spend ({currency})")
    render.table(report["by_key"], BY_KEY, title="per key")
    render.table(report["by_model"], BY_MODEL, title="per model")

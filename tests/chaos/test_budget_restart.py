"""Embedded mode (SQLite, in-process quota store and engine): a tenant that exhausted its daily
budget is still refused after the gateway process restarts; Ctrl-C hands back nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
from deployment import launch_gateway, wait_ready
from gateway_process import GatewayProcess, gateway_env, start_gateway

BUDGET = 400


def _ask(gateway: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(
        gateway.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "tiny", "messages": [{"role": "user", "content": "Spend my budget."}],
              "max_tokens": 40, "ignore_eos": True, "temperature": 0},
        timeout=60,
    )  # fmt: skip


def test_an_exhausted_daily_budget_survives_a_restart(tiny_model_dir: Path, workdir: Path) -> None:
    env = gateway_env(tiny_model_dir, workdir)  # the embedded default: nothing but SQLite
    first = start_gateway(env, workdir)
    try:
        tenant = first.tenant(daily_token_budget=BUDGET)
        spender = first.tenant()  # no budget: shows the restarted gateway serves at all
        admitted = 0
        while (r := _ask(first, tenant.key)).status_code == 200:
            admitted += 1
            assert admitted < 50, "the budget was never exhausted"
        assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
        assert admitted >= 2
    finally:
        first.stop()  # SIGTERM: the ledger is flushed on the way out
    # uvicorn re-raises the SIGTERM once shut down, so the code is -15 either way: the log tells.
    assert "Application shutdown complete" in first.log_text(), first.log_text()[-2000:]

    second = launch_gateway(env, workdir, first.admin_key)
    try:
        wait_ready(second)
        assert _ask(second, spender.key).status_code == 200
        r = _ask(second, tenant.key)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "insufficient_quota"
        assert r.headers["x-should-retry"] == "false"
        usage = httpx.get(
            f"{second.url}/admin/v1/tenants/{tenant.tenant_id}/usage",
            headers={"authorization": f"Bearer {first.admin_key}"},
            timeout=30,
        ).json()
        spent = sum(row["prompt_tokens"] + row["completion_tokens"] for row in usage)
        assert BUDGET - 2 * 40 < spent <= BUDGET  # what was spent before the restart, kept
    finally:
        second.stop()

"""Issue 45, rough edge: the engines page named the adapter-slot tier "gpu" on a CPU engine. The
engine now says its device (on its `/v1/models` base entry, read in process and by the HTTP
poller alike), and the page names the slot tier by it."""

from __future__ import annotations

import re

import httpx
import pytest
from gateway_harness import ADMIN_CTX, Gateway
from pages import login

from gateway.demo.adapters import demo_adapter_files
from gateway.engines.replicas import engine_device
from gateway.engines.status import engine_status
from tenancy.auth.scopes import Scope
from tenancy.crud.adapters import register_adapter


@pytest.mark.asyncio(loop_scope="module")
async def test_a_cpu_engines_slots_are_not_labelled_gpu(
    gateway: Gateway, browser: httpx.AsyncClient
) -> None:
    ta = await gateway.tenant(scopes=(Scope.TENANT_ADMIN, Scope.INFERENCE))
    async with gateway.state.tenancy.sessionmaker() as session:
        adapter = await register_adapter(
            session, ctx=ADMIN_CTX, service=gateway.state.tenancy.adapters,
            tenant_id=ta.tenant_id, name="slotted",
            uploads=demo_adapter_files(gateway.state.settings.base_model, seed=5),
        )  # fmt: skip
    body = gateway.chat_body("Use the adapter.", model=adapter.name, max_tokens=2)
    r = await gateway.client.post("/v1/chat/completions", headers=ta.headers, json=body)
    assert r.status_code == 200, r.text

    (replica,) = await engine_status(gateway.state.engine)
    assert replica.device == "cpu"  # the test engine runs on the CPU
    assert adapter.id in replica.adapters_by_tier["gpu"]  # the wire's name for a slot

    await login(browser, ta.key)
    page = (await browser.get("/dashboard/engines")).text
    row = re.search(r'<div data-tier="gpu"><strong>([^<]*)</strong>(.*?)</div>', page)
    assert row is not None, page
    assert row.group(1) == "cpu slot:" and "slotted" in row.group(2)
    assert "<strong>gpu:</strong>" not in page


def test_the_device_is_read_from_models_and_absent_for_vllm() -> None:
    ours = {"data": [{"id": "tiny", "device": "cuda"}, {"id": "a", "tier": "gpu"}]}
    vllm = {"data": [{"id": "tiny", "root": "/m"}, {"id": "a", "parent": "tiny"}]}
    assert engine_device(ours) == "cuda" and engine_device(vllm) is None

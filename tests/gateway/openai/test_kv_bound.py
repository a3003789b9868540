"""One request's KV footprint, n x (prompt tokens + max_tokens), is bounded per tier (issue 45:
one n=64, max_tokens=2000 request from a tenant without quotas held an engine's KV cache at 99%
for minutes). Past the bound: a 400 naming `n`, or the max tokens field when n is 1, on chat
completions, completions and the Responses API; a max_tokens the client left out is lowered to
fit instead. Through the real app, with the OpenAI SDK for the issue's own request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
from gateway_harness import MODEL, Gateway, SecretScan, gateway_settings, running_gateway

BATCH_BOUND = 256  # a small bound for the batch tier; the others keep the default
DEFAULT_BOUND = 65_536


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, secret_scan: SecretScan
) -> AsyncIterator[Gateway]:
    tiers = {
        "standard": {"lo": 10, "hi": 19, "default": 10},
        "batch": {"lo": 20, "hi": 29, "default": 20, "max_request_kv_tokens": BATCH_BOUND},
    }
    settings = gateway_settings(tiny_model_dir, tmp_path_factory.mktemp("kv"), tiers=tiers)
    async with running_gateway(settings, secret_scan) as gw:
        yield gw


@pytest.mark.asyncio(loop_scope="module")
async def test_the_issues_request_is_refused_naming_n_through_the_sdk(gateway: Gateway) -> None:
    tenant = await gateway.tenant()  # no quotas, the default tier
    sdk = openai.AsyncOpenAI(
        base_url="http://gateway/v1", api_key=tenant.key, http_client=gateway.client
    )
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=64, max_tokens=2000
        )
    error = refused.value.body
    assert isinstance(error, dict)
    assert refused.value.status_code == 400
    assert (error["type"], error["param"]) == ("invalid_request_error", "n")
    assert f"at most {DEFAULT_BOUND}" in error["message"]
    # Within the bound the same tenant is served.
    ok = await sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=4
    )
    assert len(ok.choices) == 2


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
TEXT = "Count the stars."


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        (CHAT, {"messages": [{"role": "user", "content": TEXT}], "n": 4, "max_tokens": 100}, "n"),
        (CHAT, {"messages": [{"role": "user", "content": TEXT}], "max_tokens": 250}, "max_tokens"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": TEXT}], "max_completion_tokens": 250},
            "max_completion_tokens",
        ),
        (COMPLETIONS, {"prompt": TEXT, "n": 3, "max_tokens": 80}, "n"),
        (COMPLETIONS, {"prompt": TEXT, "max_tokens": 252}, "max_tokens"),
        (COMPLETIONS, {"prompt": [TEXT, TEXT], "max_tokens": 125}, "max_tokens"),
        (RESPONSES, {"input": TEXT, "max_output_tokens": 250}, "max_output_tokens"),
    ],
)
async def test_past_the_tiers_bound_is_a_400_naming_the_field(
    gateway: Gateway, path: str, fields: dict[str, Any], param: str
) -> None:
    tenant = await gateway.tenant(tier="batch")
    recorder = gateway.record_requests()
    try:
        r = await gateway.client.post(path, headers=tenant.headers, json={"model": MODEL, **fields})
    finally:
        gateway.stop_recording(recorder)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert f"at most {BATCH_BOUND}" in error["message"] and param in error["message"]
    assert recorder.requests == []  # refused before the engine (and before admission)
    assert await gateway.usage_records(tenant) == []


@pytest.mark.asyncio(loop_scope="module")
async def test_a_default_max_tokens_is_lowered_to_fit_the_bound(gateway: Gateway) -> None:
    tenant = await gateway.tenant(tier="batch")
    recorder = gateway.record_requests()
    try:
        r = await gateway.client.post(
            COMPLETIONS, headers=tenant.headers,
            json={"model": MODEL, "prompt": TEXT, "n": 2, "temperature": 0},
        )  # fmt: skip
    finally:
        gateway.stop_recording(recorder)
    assert r.status_code == 200, r.text
    (sent,) = recorder.requests
    prompt = len(sent.token_ids)
    assert sent.sampling_params.max_tokens == BATCH_BOUND // 2 - prompt

"""Acceptance 1: the official `openai` SDK against a real gateway process and the real engine.

Chat and completions, streaming with `include_usage`, `/v1/models` per tenant, a LoRA adapter
used by its owner (and invisible to others), and the SDK exception each error maps to (with the
SDK's own retry behaviour).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from gateway_process import GatewayProcess, TenantInfo
from openai import OpenAI

from engine.protocol import tenant_label
from gateway.demo.adapters import demo_adapter_files
from tenancy.adapters.base_model import base_model_spec

MODEL = "tiny"


def sdk(gateway: GatewayProcess, key: str, **kw: object) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=key, timeout=60, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tenant(gateway_proc: GatewayProcess) -> TenantInfo:
    return gateway_proc.tenant()


def test_chat_completion(gateway_proc: GatewayProcess, tenant: TenantInfo) -> None:
    client = sdk(gateway_proc, tenant.key)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": "client-chosen-id-1"},
    )
    assert raw.headers["x-request-id"] == "client-chosen-id-1"
    assert float(raw.headers["x-loragate-overhead-ms"]) >= 0
    reply = raw.parse()
    assert reply.object == "chat.completion"
    assert reply.model == MODEL
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8
    assert reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_n_and_logprobs(gateway_proc: GatewayProcess, tenant: TenantInfo) -> None:
    reply = sdk(gateway_proc, tenant.key).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Two answers, please."}],
        max_tokens=5,
        n=2,
        seed=1,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in reply.choices] == [0, 1]
    for choice in reply.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert len(choice.logprobs.content) == 5
        assert all(len(entry.top_logprobs) == 3 for entry in choice.logprobs.content)
        assert "".join(e.token for e in choice.logprobs.content) == choice.message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 10


def test_chat_stream_with_usage(gateway_proc: GatewayProcess, tenant: TenantInfo) -> None:
    stream = sdk(gateway_proc, tenant.key).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream to me."}],
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1 and {c.model for c in chunks} == {MODEL}
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices]
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10
    text = "".join(c.choices[0].delta.content or "" for c in content)
    whole = sdk(gateway_proc, tenant.key).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream to me."}],
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert text == whole.choices[0].message.content


def test_completions_plain_echo_and_stream(
    gateway_proc: GatewayProcess, tenant: TenantInfo
) -> None:
    client = sdk(gateway_proc, tenant.key)
    reply = client.completions.create(
        model=MODEL, prompt=["Once upon a time", "In a galaxy"], max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert reply.object == "text_completion"
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    echoed = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, echo=True,
        logprobs=2, extra_body={"ignore_eos": True},
    )  # fmt: skip
    choice = echoed.choices[0]
    assert choice.text == "Once upon a time" + reply.choices[0].text
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert choice.logprobs.token_logprobs[0] is None  # the first prompt token has no logprob
    assert "".join(choice.logprobs.tokens or []) == choice.text
    streamed = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reply.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


@pytest.fixture(scope="module")
def adapter_owner(gateway_proc: GatewayProcess, tiny_model_dir: Path) -> TenantInfo:
    """A tenant that uploaded a LoRA adapter named `sql` (through the admin REST API)."""
    owner = gateway_proc.tenant()
    base = base_model_spec(tiny_model_dir, MODEL)
    files = [(f.filename, f.data) for f in demo_adapter_files(base, seed=7)]
    gateway_proc.upload_adapter(owner.tenant_id, "sql", files)
    return owner


def test_models_are_scoped_per_tenant(
    gateway_proc: GatewayProcess, tenant: TenantInfo, adapter_owner: TenantInfo
) -> None:
    owner_models = sdk(gateway_proc, adapter_owner.key).models.list()
    assert [m.id for m in owner_models.data] == [MODEL, "sql"]
    assert all(m.object == "model" for m in owner_models.data)
    client = sdk(gateway_proc, tenant.key)
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    assert sdk(gateway_proc, adapter_owner.key).models.retrieve("sql").id == "sql"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("sql")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_an_adapter_is_used_by_its_owner_only(
    gateway_proc: GatewayProcess, tenant: TenantInfo, adapter_owner: TenantInfo
) -> None:
    def ask(key: str, model: str) -> str:
        reply = sdk(gateway_proc, key).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "SELECT"}], max_tokens=12,
            temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert reply.model == model
        return reply.choices[0].message.content or ""

    with_adapter = ask(adapter_owner.key, "sql")
    assert with_adapter != ask(adapter_owner.key, MODEL)  # the adapter changes the output
    assert with_adapter == ask(adapter_owner.key, "sql")  # and deterministically so
    # Another tenant gets the same answer as for a model that does not exist.
    with pytest.raises(openai.NotFoundError) as caught:
        ask(tenant.key, "sql")
    assert caught.value.code == "model_not_found"


def test_authentication_error(gateway_proc: GatewayProcess) -> None:
    for key in ("lg_" + "x" * 49, "' OR '1'='1", "not-a-key"):
        with pytest.raises(openai.AuthenticationError) as caught:
            sdk(gateway_proc, key).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )
        assert caught.value.code == "invalid_api_key"


def test_permission_denied_for_a_key_without_inference_scope(gateway_proc: GatewayProcess) -> None:
    # The bootstrap key has the admin scope only.
    with pytest.raises(openai.PermissionDeniedError) as caught:
        sdk(gateway_proc, gateway_proc.admin_key).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert caught.value.code == "insufficient_scope"


def test_not_found_for_unknown_model(gateway_proc: GatewayProcess, tenant: TenantInfo) -> None:
    # (another tenant's adapter: test_an_adapter_is_used_by_its_owner_only)
    with pytest.raises(openai.NotFoundError) as caught:
        sdk(gateway_proc, tenant.key).chat.completions.create(
            model="someone-elses-adapter", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**9}, "max_tokens"),
        ({"n": 10**6}, "n"),
        ({"logprobs": True, "top_logprobs": 10**6}, "top_logprobs"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"temperature": -1}, "temperature"),
    ],
)
def test_bad_request(
    gateway_proc: GatewayProcess, tenant: TenantInfo, fields: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(gateway_proc, tenant.key).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            **fields,  # type: ignore[arg-type]
        )
    assert caught.value.param == param


def test_rate_limit_error_carries_retry_after(gateway_proc: GatewayProcess) -> None:
    limited = gateway_proc.tenant(requests_per_minute=1)
    client = sdk(gateway_proc, limited.key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )
    assert raw.headers["x-ratelimit-limit-requests"] == "1"
    assert raw.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    headers = caught.value.response.headers
    assert caught.value.code == "rate_limit_exceeded"
    assert 1 <= int(headers["retry-after"]) <= 60
    assert int(headers["retry-after-ms"]) > 0
    assert headers["x-ratelimit-limit-requests"] == "1"
    assert "x-should-retry" not in headers  # a rate limit may be retried


def _rejections(gateway: GatewayProcess, tenant_id: str, reason: str) -> float:
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if (
            line.startswith("loragate_gateway_rejections_total{")
            and f'tenant="{tenant_label(tenant_id)}"' in line  # a digest, never the id
        ) and f'reason="{reason}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_exhausted_budget_is_not_retried(gateway_proc: GatewayProcess) -> None:
    broke = gateway_proc.tenant(daily_token_budget=10)
    client = sdk(gateway_proc, broke.key, max_retries=3)
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=50
        )
    assert caught.value.code == "insufficient_quota"
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert time.monotonic() - started < 5  # no backoff sleeps
    assert _rejections(gateway_proc, broke.tenant_id, "insufficient_quota") == 1.0

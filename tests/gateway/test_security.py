"""SECURITY.md, the request and authentication lines, through the real app and engine.

(Keys, salts and prompt texts never reaching a log is checked over the whole gateway test run
by the `secret_scan` fixture in conftest.py.)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import uuid
from typing import Any

import pytest
from gateway_harness import ADMIN_CTX, MODEL, Gateway, RecordingClient

from tenancy.crud.keys import revoke_key
from tenancy.sql.models import ApiKey

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = "/v1/chat/completions"
GENERATE = "/inference/v1/generate"


def _chat_json(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            **fields}  # fmt: skip


# ---- authentication ------------------------------------------------------------------------------

BAD_AUTHORIZATION: list[bytes] = [
    b"Bearer ' OR '1'='1",
    b"Bearer x' UNION SELECT key_hash FROM api_keys --",
    b"Bearer lg_" + b"A" * 10240,
    "Bearer lg_ключ-ünïcödé".encode(),
    b"Bearer",
    b"Bearer ",
    b"Basic dXNlcjpwYXNzd29yZA==",
    b"lg_" + b"A" * 49,
    b"Bearer lg_" + b"A" * 49,  # the right shape, a bad checksum
]


async def test_bad_keys_get_one_constant_401(gateway: Gateway) -> None:
    bodies = set()
    for authorization in [*BAD_AUTHORIZATION, None]:
        headers = {} if authorization is None else {"authorization": authorization}
        for method, path, body in (
            ("POST", CHAT, _chat_json()),
            ("GET", "/v1/models", None),
            ("POST", GENERATE, {"token_ids": [1], "sampling_params": {}}),
        ):
            r = await gateway.client.request(method, path, headers=headers, json=body)
            assert r.status_code == 401, (authorization, path)
            assert "sql" not in r.text.lower() and "select" not in r.text.lower()
            bodies.add(r.text)
    assert len(bodies) == 1
    assert json.loads(bodies.pop())["error"]["code"] == "invalid_api_key"


async def test_revoked_key_stops_working_within_seconds(gateway: Gateway) -> None:
    for notify in (True, False):
        tenant = await gateway.tenant()
        ok = await gateway.client.post(CHAT, headers=tenant.headers, json=_chat_json())
        assert ok.status_code == 200  # the key is now cached
        runtime = gateway.state.tenancy
        async with runtime.sessionmaker() as session:
            key = (await session.scalars(
                ApiKey.__table__.select().where(ApiKey.tenant_id == tenant.tenant_id)
            )).first()  # fmt: skip
            assert key is not None
            await revoke_key(
                session, ctx=ADMIN_CTX, tenant_id=tenant.tenant_id, key_id=key,
                now=dt.datetime.now(dt.UTC),
            )  # fmt: skip
        if notify:  # what the admin route does; another replica only has the cache TTL
            await runtime.keys.invalidate(key_id=key)
        started = asyncio.get_running_loop().time()
        while True:
            r = await gateway.client.post(CHAT, headers=tenant.headers, json=_chat_json())
            if r.status_code == 401:
                break
            assert asyncio.get_running_loop().time() - started < 2.5
            await asyncio.sleep(0.1)


async def test_an_inference_key_is_refused_on_admin_routes_and_admin_keys_on_inference(
    gateway: Gateway,
) -> None:
    tenant = await gateway.tenant()
    r = await gateway.client.get("/admin/v1/tenants", headers=tenant.headers)
    assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
    admin = await gateway.tenant(scopes=("tenant-admin",))  # type: ignore[arg-type]
    r = await gateway.client.post(CHAT, headers=admin.headers, json=_chat_json())
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"


async def test_host_header_and_path_tricks_never_skip_authentication(gateway: Gateway) -> None:
    for host in ("x/health?", "localhost/metrics#", "gateway"):
        for method, path in (("GET", "/v1/models"), ("POST", CHAT), ("POST", GENERATE)):
            r = await gateway.client.request(
                method, path, headers={"host": host}, json=_chat_json()
            )
            assert r.status_code == 401, (host, path)
    for path in ("/health/../v1/models", "/v1/models/../../health", "//v1/models",
                 "/v1/models%2f..%2f..%2fhealth", "/v1/models?next=/health"):  # fmt: skip
        r = await gateway.client.get(path)
        # Either refused, or (a client normalising the dots) the public liveness probe.
        assert r.status_code in (401, 404) or r.json() == {"status": "ok"}, path
        assert "data" not in r.text


# ---- routing fields ------------------------------------------------------------------------------


async def test_client_routing_fields_are_overwritten(gateway: Gateway) -> None:
    tenant = await gateway.tenant(tier="batch")
    band = gateway.state.settings.tiers["batch"]
    hostile = {
        "cache_salt": "chosen-by-client",
        "kv_transfer_params": {"remote_host": "10.0.0.1", "do_remote_prefill": True},
        "fairness_key": "someone-else",
        "engine_url": "http://attacker.example:8100",
        "engine_urls": ["http://attacker.example:8100"],
        "request_id": "client-request-id",
        "priority": band.lo - 1000,
    }
    recorder: RecordingClient = gateway.record_requests()
    try:
        r = await gateway.client.post(CHAT, headers=tenant.headers, json=_chat_json(**hostile))
        assert r.status_code == 200
        body = {"token_ids": [3, 4, 5], "sampling_params": {"max_tokens": 2}, **hostile}
        r = await gateway.client.post(GENERATE, headers=tenant.headers, json=body)
        assert r.status_code == 200
        echoed = r.json()
    finally:
        gateway.stop_recording(recorder)
    assert len(recorder.requests) == 2
    for sent in recorder.requests:
        assert sent.cache_salt == gateway.salt_of(tenant)
        assert sent.kv_transfer_params is None
        assert sent.fairness_key == tenant.tenant_id
        assert sent.priority == band.lo  # clamped into the band, never raised
        assert sent.request_id != "client-request-id"
        assert sent.model is None
    # The pass-through answers with the client's id and no transfer parameters.
    assert echoed["request_id"] == "client-request-id"
    assert echoed["kv_transfer_params"] is None


# ---- bad input -----------------------------------------------------------------------------------


def _raw(prefix: str, value: str) -> bytes:
    return (prefix % value).encode()


CHAT_RAW = '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], %s}'
NESTED = "[" * 100_000 + "]" * 100_000

BAD_REQUESTS: list[tuple[str, bytes, int, str | None]] = [
    (GENERATE, b'{"token_ids": [-1], "sampling_params": {}}', 400, "token_ids"),
    (GENERATE, b'{"token_ids": [4096000], "sampling_params": {}}', 400, "token_ids"),
    (GENERATE, b'{"token_ids": [], "sampling_params": {}}', 400, "token_ids"),
    (GENERATE, b'{"token_ids": [1], "sampling_params": {"temperature": NaN}}', 400,
     "sampling_params"),
    (GENERATE, b'{"token_ids": [1], "sampling_params": {"n": 1000000}}', 400, "sampling_params.n"),
    (GENERATE, b'{"token_ids": [1], "sampling_params": {"max_tokens": 0}}', 400,
     "sampling_params.max_tokens"),
    (GENERATE, b'{"token_ids": [1], "sampling_params": {}, "features": {"image": 1}}', 400,
     "features"),
    (GENERATE, b'{"token_ids": [1], "sampling_params": {"structured_outputs": {"regex": "("}}}',
     400, "sampling_params.structured_outputs.regex"),
    (GENERATE, b'{"token_ids": [1], "sampling_params": {"structured_outputs": {"jsn": {}}}}',
     400, "sampling_params.structured_outputs.jsn"),
    ("/v1/completions", b'{"model": "tiny", "prompt": ""}', 400, "prompt"),
    ("/v1/completions", b'{"model": "tiny", "prompt": [999999]}', 400, "prompt"),
    ("/v1/completions", b'{"model": "tiny", "prompt": [[]]}', 400, "prompt"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "logprobs": 1000000}', 400, "logprobs"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "suffix": "x"}', 400, "suffix"),
    (CHAT, _raw(CHAT_RAW, '"max_tokens": 0'), 400, "max_tokens"),
    (CHAT, _raw(CHAT_RAW, '"max_tokens": 1000000000'), 400, "max_tokens"),
    (CHAT, _raw(CHAT_RAW, '"n": 1000000'), 400, "n"),
    (CHAT, _raw(CHAT_RAW, '"logprobs": true, "top_logprobs": 1000000'), 400, "top_logprobs"),
    (CHAT, _raw(CHAT_RAW, '"temperature": NaN'), 400, "temperature"),
    (CHAT, _raw(CHAT_RAW, f'"priority": {2**70}'), 400, "priority"),
    (CHAT, _raw(CHAT_RAW, f'"top_k": {2**70}'), 400, "top_k"),
    (CHAT, _raw(CHAT_RAW, f'"stop_token_ids": [{2**70}]'), 400, "stop_token_ids"),
    (CHAT, _raw(CHAT_RAW, f'"top_logprobs": {-2**70}'), 400, "top_logprobs"),
    ("/v1/completions", f'{{"model": "tiny", "prompt": "hi", "max_tokens": {2**70}}}'.encode(),
     400, "max_tokens"),
    ("/v1/completions", f'{{"model": "tiny", "prompt": [[{2**70}]]}}'.encode(), 400, "prompt"),
    (CHAT, _raw(CHAT_RAW, '"top_p": Infinity'), 400, "top_p"),
    (CHAT, _raw(CHAT_RAW, '"presence_penalty": -Infinity'), 400, "presence_penalty"),
    (CHAT, _raw(CHAT_RAW, '"response_format": {"type": "json_schema"}'), 400, "response_format"),
    (CHAT, _raw(CHAT_RAW, '"response_format": {"type": "json_schema", "json_schema": {"name": "x",'
                          ' "schema": {"type": "object", "properties": {"a": {"$ref": "#/x"}}}}}'),
     400, "response_format.json_schema.schema"),
    (CHAT, _raw(CHAT_RAW, '"tools": [{"type": "function", "function": {"name": "a b"}}]'), 400,
     "tools[0].function.name"),
    (CHAT, _raw(CHAT_RAW, f'"metadata": {NESTED}'), 400, None),
    (CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),
    (CHAT, b'{"model": "tiny", "messages": []}', 400, "messages"),
    (CHAT, b'{"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}', 400,
     "messages.0.role"),
    (CHAT, b"[1, 2, 3]", 400, None),
    (CHAT, b"", 400, None),
]  # fmt: skip


async def test_bad_input_is_a_4xx_naming_the_field_and_the_engine_is_untouched(
    gateway: Gateway,
) -> None:
    tenant = await gateway.tenant()
    engine = gateway.state.engine.engine  # type: ignore[attr-defined]
    recorder = gateway.record_requests()
    before = engine.stats().prompt_tokens_total
    try:
        for path, raw, status, param in BAD_REQUESTS:
            r = await gateway.client.post(
                path, content=raw, headers={**tenant.headers, "content-type": "application/json"}
            )
            assert r.status_code == status, (path, raw[:80], r.text)
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            if param is not None:
                assert error["param"] == param or error["param"].startswith(param), (
                    raw[:80],
                    error,
                )
        long_prompt = "lighthouse " * 3000  # far past the 2048-token context
        r = await gateway.client.post(
            CHAT, headers=tenant.headers, json=gateway.chat_body(long_prompt)
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert r.json()["error"]["param"] == "messages"
        r = await gateway.client.post(
            CHAT, headers=tenant.headers, content=b"x" * (3 * 1024 * 1024)
        )
        assert r.status_code == 413
    finally:
        gateway.stop_recording(recorder)
    assert recorder.requests == []
    await engine.wait_until_idle()
    assert engine.stats().prompt_tokens_total == before


async def test_a_burst_against_a_tiny_budget_admits_at_most_budget_plus_one(
    gateway: Gateway,
) -> None:
    budget = 500
    tenant = await gateway.tenant(daily_token_budget=budget)
    body = gateway.chat_body("Spend my budget, please!", max_tokens=50, ignore_eos=True)
    results = await asyncio.gather(
        *(gateway.client.post(CHAT, headers=tenant.headers, json=body) for _ in range(40))
    )
    admitted = [r for r in results if r.status_code == 200]
    rejected = [r for r in results if r.status_code != 200]
    assert admitted and rejected
    assert {r.status_code for r in rejected} == {429}
    assert {r.json()["error"]["code"] for r in rejected} == {"insufficient_quota"}
    assert all(r.headers["x-should-retry"] == "false" for r in rejected)
    reservation = admitted[0].json()["usage"]["prompt_tokens"] + 50
    assert len(admitted) * reservation <= budget + reservation
    usage = await gateway.state.tenancy.quotas.usage(f"t:{tenant.tenant_id}")
    assert usage.day_tokens <= budget + reservation
    assert usage.num_leases == 0


# ---- metrics -------------------------------------------------------------------------------------


def _series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("loragate_gateway_")]


async def _random_models(gateway: Gateway, headers: dict[str, str], count: int) -> None:
    for start in range(0, count, 200):
        batch = [
            gateway.client.post(
                CHAT, headers=headers, json=_chat_json(model=f"m-{uuid.uuid4().hex}")
            )
            for _ in range(min(200, count - start))
        ]
        for r in await asyncio.gather(*batch):
            assert r.status_code == 404


@pytest.mark.parametrize(
    "count", [2_000, pytest.param(100_000, marks=pytest.mark.slow)], ids=["2k", "100k"]
)
async def test_random_model_names_leave_metrics_bounded(gateway: Gateway, count: int) -> None:
    tenant = await gateway.tenant()
    before = len(_series((await gateway.client.get("/metrics")).text))
    await _random_models(gateway, tenant.headers, count)
    text = (await gateway.client.get("/metrics")).text
    models = set(re.findall(r'model="([^"]*)"', text))
    assert models <= {MODEL, "unknown", "other"}
    assert len(_series(text)) <= before + 10  # one new rejection series for this tenant

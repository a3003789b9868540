"""The engine's HTTP server over the real engine on the tiny model (spec/tokens-api.md).

Most tests go through httpx's ASGI transport; the ones that need a live stream (abort while
streaming, client disconnects) run a real uvicorn on a free loopback port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.metrics import MAX_TENANT_LABELS, OTHER_TENANT, EngineMetrics, priority_band
from engine.outputs import EngineStats, RequestOutput
from engine.server import create_app

TIMEOUT_S = 30
GENERATE = "/inference/v1/generate"
LONG = 1500  # max_tokens of a request that is still running whenever a test acts on it


def gen_body(max_tokens: int = 6, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "token_ids": [1, 2, 3, 4, 5],
        "sampling_params": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True},
    }
    sampling = fields.pop("sampling_params", {})
    body["sampling_params"].update(sampling)
    body.update(fields)
    return body


@pytest.fixture(scope="module")
def llm_engine(tiny_model_dir: Path) -> Iterator[LLMEngine]:
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_model_dir), served_model_name="tiny", num_kv_blocks=256, max_num_seqs=8
        )
    )
    yield engine
    engine.check_invariants()


@pytest.fixture
async def engine(llm_engine: LLMEngine) -> AsyncIterator[AsyncEngine]:
    async_engine = AsyncEngine(llm_engine)
    yield async_engine
    await asyncio.wait_for(async_engine.shutdown(drain_timeout_s=0), TIMEOUT_S)
    assert not llm_engine.has_unfinished_requests()
    llm_engine.check_invariants()


@pytest.fixture
async def client(engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://engine", timeout=TIMEOUT_S
    ) as http:
        yield http


@pytest.fixture
async def live_url(engine: AsyncEngine) -> AsyncIterator[str]:
    """A real uvicorn serving the app; leaving runs the app's lifespan shutdown (drain)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections wait in the backlog until uvicorn accepts them
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await asyncio.wait_for(task, TIMEOUT_S)
    sock.close()
    assert not engine.is_healthy  # the lifespan drained and stopped the engine


def parse_sse(text: str) -> list[Any]:
    """The events of a complete SSE body; asserts the framing on the way."""
    assert text.endswith("\n\n")
    events = []
    for block in text[:-2].split("\n\n"):
        assert block.startswith("data: "), block
        assert "\n" not in block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def read_events(response: httpx.Response) -> AsyncIterator[Any]:
    async for line in response.aiter_lines():
        if not line:
            continue
        assert line.startswith("data: ")
        payload = line[len("data: ") :]
        yield payload if payload == "[DONE]" else json.loads(payload)


async def engine_untouched(engine: AsyncEngine) -> None:
    assert await engine.run_in_loop(lambda e: e.num_unfinished_requests()) == 0
    assert engine.num_in_flight == 0


async def assert_idle_and_consistent(engine: AsyncEngine) -> None:
    await asyncio.wait_for(engine.wait_until_idle(), TIMEOUT_S)
    await engine.run_in_loop(lambda e: e.check_invariants())
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (0, 0, 0.0)
    assert engine.num_in_flight == 0


async def wait_until(predicate: Callable[[], bool]) -> None:
    """For states no event announces (a request admitted on the far side of HTTP)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def metric_samples(text: str) -> dict[str, list[Any]]:
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def break_the_loop(llm_engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection on the real engine: its next step fails like a kernel or CUDA error."""

    def failing_step() -> list[RequestOutput]:
        raise RuntimeError("injected step failure")

    monkeypatch.setattr(llm_engine, "step", failing_step)


# ---- generate ---------------------------------------------------------------------------------


async def test_non_streaming_body(client: httpx.AsyncClient, engine: AsyncEngine):
    response = await client.post(GENERATE, json=gen_body(max_tokens=6, request_id="r-1"))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"request_id", "choices", "prompt_logprobs", "kv_transfer_params", "usage"}
    assert body["request_id"] == "r-1"
    [choice] = body["choices"]
    assert set(choice) == {"index", "token_ids", "finish_reason", "stop_reason", "logprobs"}
    assert choice["index"] == 0 and len(choice["token_ids"]) == 6
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert choice["logprobs"] is None and body["prompt_logprobs"] is None
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "cached_tokens": 0}
    assert all(0 <= t < engine.vocab_size for t in choice["token_ids"])
    await assert_idle_and_consistent(engine)


async def test_request_id_defaults_to_a_fresh_uuid(client: httpx.AsyncClient):
    first = (await client.post(GENERATE, json=gen_body(max_tokens=1))).json()["request_id"]
    second = (await client.post(GENERATE, json=gen_body(max_tokens=1))).json()["request_id"]
    assert len(first) == 36 and first != second


async def test_streaming_events(client: httpx.AsyncClient, engine: AsyncEngine):
    plain = (await client.post(GENERATE, json=gen_body(max_tokens=6))).json()
    response = await client.post(
        GENERATE,
        json=gen_body(
            max_tokens=6,
            request_id="s-1",
            stream=True,
            stream_options={"include_usage": True},
            kv_transfer_params={"remote": {"block_ids": [1, 2]}},
        ),
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert all(chunk["request_id"] == "s-1" for chunk in (*chunks, usage))
    assert chunks[0]["kv_transfer_params"] == {"remote": {"block_ids": [1, 2]}}
    streamed = [t for chunk in chunks for c in chunk["choices"] for t in c["token_ids"]]
    assert streamed == plain["choices"][0]["token_ids"]  # greedy: the same tokens, each once
    finish = [c["finish_reason"] for chunk in chunks for c in chunk["choices"]]
    assert finish[-1] == "length" and set(finish[:-1]) == {None}
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "cached_tokens": 0}
    await assert_idle_and_consistent(engine)


async def test_streaming_without_usage_has_no_usage_event(client: httpx.AsyncClient):
    response = await client.post(GENERATE, json=gen_body(max_tokens=3, stream=True))
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]"
    assert all(event["choices"] and event["usage"] is None for event in events[:-1])


async def test_n_choices_and_logprobs_shape(client: httpx.AsyncClient):
    body = gen_body(
        max_tokens=4,
        sampling_params={
            "n": 2,
            "temperature": 1.0,
            "seed": 3,
            "logprobs": 2,
            "prompt_logprobs": 1,
        },
    )
    payload = (await client.post(GENERATE, json=body)).json()
    assert [c["index"] for c in payload["choices"]] == [0, 1]
    for choice in payload["choices"]:
        content = choice["logprobs"]["content"]
        assert len(content) == len(choice["token_ids"]) == 4
        for token_id, entry in zip(choice["token_ids"], content, strict=True):
            assert entry["token"] == f"token_id:{token_id}"
            assert entry["bytes"] is None and entry["logprob"] <= 0
            assert len(entry["top_logprobs"]) == 2
            assert all(top["token"].startswith("token_id:") for top in entry["top_logprobs"])
    prompt = payload["prompt_logprobs"]
    assert len(prompt) == 5 and prompt[0] is None
    for position, token_id in enumerate([2, 3, 4, 5], start=1):
        entry = prompt[position]
        assert str(token_id) in entry  # the prompt token itself, plus the top 1
        assert all(set(v) == {"logprob", "rank"} for v in entry.values())


async def test_same_seed_gives_the_same_tokens(client: httpx.AsyncClient):
    body = gen_body(max_tokens=8, sampling_params={"temperature": 1.0, "seed": 42})
    first = (await client.post(GENERATE, json=body)).json()["choices"][0]["token_ids"]
    second = (await client.post(GENERATE, json=body)).json()["choices"][0]["token_ids"]
    assert first == second


async def test_max_tokens_past_the_context_is_capped(
    client: httpx.AsyncClient, engine: AsyncEngine
):
    prompt = [7] * (engine.max_model_len - 3)
    body = gen_body(token_ids=prompt, sampling_params={"max_tokens": 10**9})
    payload = (await client.post(GENERATE, json=body)).json()
    assert len(payload["choices"][0]["token_ids"]) == 3
    assert payload["choices"][0]["finish_reason"] == "length"


async def test_usage_counts_prefix_cache_hits(client: httpx.AsyncClient, engine: AsyncEngine):
    block = engine.config.block_size
    body = gen_body(max_tokens=1, token_ids=list(range(1, 3 * block + 2)), cache_salt="s")
    first = (await client.post(GENERATE, json=body)).json()["usage"]
    second = (await client.post(GENERATE, json=body)).json()["usage"]
    other_salt = (await client.post(GENERATE, json={**body, "cache_salt": "t"})).json()["usage"]
    assert first["cached_tokens"] == 0 and other_salt["cached_tokens"] == 0
    assert second["cached_tokens"] == 3 * block
    assert second["prompt_tokens"] == 3 * block + 1


async def test_logs_never_hold_salts_or_tenant_keys(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
):
    caplog.set_level("DEBUG")
    salt, tenant = "SALT-5f1e2d", "TENANT-9a8b7c"
    await client.post(GENERATE, json=gen_body(cache_salt=salt, fairness_key=tenant))
    await client.post(GENERATE, json=gen_body(cache_salt=salt, token_ids=[-1]))
    await client.post(GENERATE, json=gen_body(cache_salt=salt, stream=True, max_tokens=2))
    metrics = (await client.get("/metrics")).text
    assert caplog.records  # something was logged, so the check below means something
    for secret in (salt, tenant):
        assert secret not in caplog.text and secret not in metrics


async def test_model_names(client: httpx.AsyncClient, engine: AsyncEngine):
    for model in (None, engine.model_name):
        response = await client.post(GENERATE, json=gen_body(max_tokens=1, model=model))
        assert response.status_code == 200
    response = await client.post(GENERATE, json=gen_body(model="no-such-lora"))
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "model"
    await engine_untouched(engine)


# ---- bad requests -------------------------------------------------------------------------------

BAD: list[tuple[str, bytes, str | None]] = [
    ("negative id", json.dumps(gen_body(token_ids=[1, -1])).encode(), "token_ids"),
    ("id past vocab", json.dumps(gen_body(token_ids=[10**9])).encode(), "token_ids"),
    ("empty prompt", json.dumps(gen_body(token_ids=[])).encode(), "token_ids"),
    ("prompt too long", json.dumps(gen_body(token_ids=[1] * 5000)).encode(), "token_ids"),
    (
        "unknown sampling field",
        json.dumps(gen_body(sampling_params={"tempratur": 1})).encode(),
        "sampling_params.tempratur",
    ),
    (
        "max_tokens 0",
        json.dumps(gen_body(sampling_params={"max_tokens": 0})).encode(),
        "sampling_params.max_tokens",
    ),
    ("n 10^6", json.dumps(gen_body(sampling_params={"n": 10**6})).encode(), "sampling_params.n"),
    (
        "logprobs 10^6",
        json.dumps(gen_body(sampling_params={"logprobs": 10**6})).encode(),
        "sampling_params.logprobs",
    ),
    ("priority past int64", json.dumps(gen_body(priority=2**63)).encode(), "priority"),
    ("features", json.dumps(gen_body(features={"pixel_values": []})).encode(), "features"),
    (
        "NaN",
        b'{"token_ids": [1], "sampling_params": {"temperature": NaN}}',
        "sampling_params.temperature",
    ),
    (
        "Infinity",
        b'{"token_ids": [1], "sampling_params": {"top_p": Infinity}}',
        "sampling_params.top_p",
    ),
    ("invalid utf-8", b'{"token_ids": [1], "sampling_params": {}, "cache_salt": "\xc3\x28"}', None),
    (
        "deep nesting",
        b'{"token_ids": [1], "sampling_params": {}, "kv_transfer_params": {"a": '
        + b"[" * 50_000
        + b"]" * 50_000
        + b"}}",
        None,
    ),
    ("array body", b"[1, 2, 3]", None),
    ("not json", b"token_ids=1", None),
    ("empty body", b"", None),
]


@pytest.mark.parametrize(("raw", "param"), [(r, p) for _, r, p in BAD], ids=[n for n, _, _ in BAD])
async def test_bad_requests_are_400_and_leave_the_engine_serving(
    client: httpx.AsyncClient, engine: AsyncEngine, raw: bytes, param: str | None
):
    prompt_tokens = engine.stats().prompt_tokens_total
    response = await client.post(
        GENERATE, content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert error["param"] == param
    if param == "token_ids" and b"-1" in raw:
        assert "token ids must not be negative" in error["message"]
    await engine_untouched(engine)
    assert engine.stats().prompt_tokens_total == prompt_tokens
    ok = await client.post(GENERATE, json=gen_body(max_tokens=1))
    assert ok.status_code == 200


async def test_bodies_over_the_limit_are_413(client: httpx.AsyncClient, engine: AsyncEngine):
    big = b'{"token_ids": [' + b"1," * (4 << 20) + b'1], "sampling_params": {}}'
    assert len(big) > 8 << 20
    response = await client.post(GENERATE, content=big)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"

    async def chunked() -> AsyncIterator[bytes]:  # no content-length: counted while read
        for _ in range(9):
            yield b" " * (1 << 20)

    response = await client.post(GENERATE, content=chunked())
    assert response.status_code == 413
    await engine_untouched(engine)


async def test_fcfs_engine_refuses_priority(tiny_model_dir: Path):
    llm = LLMEngine(
        EngineConfig(model=str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=4, policy="fcfs")
    )
    engine = AsyncEngine(llm)
    try:
        transport = httpx.ASGITransport(app=create_app(engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
            response = await http.post(GENERATE, json=gen_body(priority=5))
            assert response.status_code == 400
            assert response.json()["error"]["param"] == "priority"
            response = await http.post(GENERATE, json=gen_body(max_tokens=1, priority=0))
            assert response.status_code == 200
    finally:
        await engine.shutdown(drain_timeout_s=0)


# ---- abort, disconnects -------------------------------------------------------------------------


async def test_abort_requests_body_rules(client: httpx.AsyncClient):
    response = await client.post("/abort_requests", json={"request_ids": ["nope"]})
    assert response.status_code == 200 and response.content == b""
    for raw in (b"{}", b"not json", b'{"request_ids": "x"}'):
        response = await client.post("/abort_requests", content=raw)
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"


async def test_abort_of_a_running_stream(live_url: str, engine: AsyncEngine):
    body = gen_body(
        max_tokens=LONG, request_id="to-abort", stream=True, stream_options={"include_usage": True}
    )
    async with (
        httpx.AsyncClient(base_url=live_url, timeout=TIMEOUT_S) as http,
        http.stream("POST", GENERATE, json=body) as response,
    ):
        assert response.status_code == 200
        events = read_events(response)
        first = await anext(events)
        assert first["choices"][0]["token_ids"]
        aborted = await http.post("/abort_requests", json={"request_ids": ["to-abort"]})
        assert aborted.status_code == 200
        rest = [event async for event in events]
    assert rest[-1] == "[DONE]"
    usage = rest[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] < LONG
    finishes = [c["finish_reason"] for e in (first, *rest[:-2]) for c in e["choices"]]
    assert finishes[-1] == "abort" and set(finishes[:-1]) == {None}
    await assert_idle_and_consistent(engine)


async def test_stream_client_disconnect_aborts(live_url: str, engine: AsyncEngine):
    before = engine.stats().generation_tokens_total
    async with httpx.AsyncClient(base_url=live_url, timeout=TIMEOUT_S) as http:
        async with http.stream("POST", GENERATE, json=gen_body(LONG, stream=True)) as response:
            first = await anext(read_events(response))
            assert first["choices"][0]["token_ids"]
        # leaving the block closes the connection mid-stream
        await assert_idle_and_consistent(engine)
        assert engine.stats().generation_tokens_total - before < LONG
        metrics = metric_samples((await http.get("/metrics")).text)
    aborted = [
        s.value
        for s in metrics["vllm:request_success_total"]
        if s.labels["finished_reason"] == "abort"
    ]
    assert aborted == [1.0]


async def test_non_streaming_client_disconnect_aborts(live_url: str, engine: AsyncEngine):
    before = engine.stats().generation_tokens_total
    async with httpx.AsyncClient(base_url=live_url, timeout=TIMEOUT_S) as http:
        request = asyncio.create_task(http.post(GENERATE, json=gen_body(LONG)))
        await wait_until(lambda: engine.stats().num_running == 1)
        request.cancel()  # closes the connection
        with pytest.raises(asyncio.CancelledError):
            await request
        await assert_idle_and_consistent(engine)
    assert engine.stats().generation_tokens_total - before < LONG


# ---- engine failures ----------------------------------------------------------------------------


async def test_engine_failure_is_500_then_health_503(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    llm_engine: LLMEngine,
    monkeypatch: pytest.MonkeyPatch,
):
    assert (await client.get("/health")).status_code == 200
    break_the_loop(llm_engine, monkeypatch)
    response = await client.post(GENERATE, json=gen_body(request_id="doomed"))
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["code"] == 500
    assert "injected" not in error["message"]
    health = await client.get("/health")
    assert health.status_code == 503 and health.json() == {"status": "dead"}
    response = await client.post(GENERATE, json=gen_body())
    assert response.status_code == 503
    await engine.shutdown()
    monkeypatch.undo()
    llm_engine.abort_requests(["doomed"])


async def test_engine_failure_mid_stream_is_an_error_event(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    llm_engine: LLMEngine,
    monkeypatch: pytest.MonkeyPatch,
):
    break_the_loop(llm_engine, monkeypatch)
    response = await client.post(GENERATE, json=gen_body(request_id="doomed-stream", stream=True))
    assert response.status_code == 200
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]"
    assert events[-2] == {
        "error": {
            "message": events[-2]["error"]["message"],
            "type": "server_error",
            "param": None,
            "code": 500,
        }
    }
    await engine.shutdown()
    monkeypatch.undo()
    llm_engine.abort_requests(["doomed-stream"])


# ---- health, shutdown, metrics ------------------------------------------------------------------


async def test_health_is_503_once_draining(client: httpx.AsyncClient, engine: AsyncEngine):
    response = await client.get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    await engine.shutdown(drain_timeout_s=1)
    response = await client.get("/health")
    assert response.status_code == 503 and response.json() == {"status": "draining"}
    response = await client.post(GENERATE, json=gen_body())
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "server_error"


async def test_live_server_serves_and_drains(live_url: str, engine: AsyncEngine):
    async with httpx.AsyncClient(base_url=live_url, timeout=TIMEOUT_S) as http:
        assert (await http.get("/health")).status_code == 200
        response = await http.post(GENERATE, json=gen_body(max_tokens=3))
        assert len(response.json()["choices"][0]["token_ids"]) == 3
    # the fixture's teardown checks that uvicorn's shutdown drained the engine


VLLM_NAMES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:request_success_total",
]


async def test_metrics_names_and_values(client: httpx.AsyncClient, engine: AsyncEngine):
    before = engine.stats()
    await client.post(GENERATE, json=gen_body(max_tokens=4, priority=-3, fairness_key="tenant-a"))
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = metric_samples(response.text)
    for name in VLLM_NAMES:
        assert name in samples, name
        assert all(s.labels["model_name"] == engine.model_name for s in samples[name])
    generated = samples["vllm:generation_tokens_total"][0].value
    assert generated - before.generation_tokens_total == 4
    lengths = [
        s.value
        for s in samples["vllm:request_success_total"]
        if s.labels["finished_reason"] == "length"
    ]
    assert lengths == [1.0]
    ttft = samples["vllm:time_to_first_token_seconds_count"]
    assert [s.value for s in ttft] == [1.0]
    bands = {
        s.labels["priority_band"]: s.value
        for s in samples["loragate_engine_queue_wait_seconds_count"]
    }
    assert bands == {"lt0": 1.0}
    tenants = {s.labels["tenant"] for s in samples["loragate_engine_served_tokens"]}
    assert tenants and "tenant-a" not in tenants  # hashed, never in clear


def test_metrics_use_their_own_registry_and_bound_tenant_labels():
    served = {f"salt-{i}": 1000 - i for i in range(10_000)}
    stats = EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, served_tokens_by_tenant=served)
    first = EngineMetrics(model_name="m", stats=lambda: stats)
    second = EngineMetrics(model_name="m", stats=lambda: stats)  # no duplicate-name clash
    assert first.registry is not second.registry
    assert REGISTRY.get_sample_value("vllm:prompt_tokens_total", {"model_name": "m"}) is None
    text = generate_latest(first.registry).decode()
    assert "salt-" not in text
    series = metric_samples(text)["loragate_engine_served_tokens"]
    assert len(series) == MAX_TENANT_LABELS + 1
    other = [s.value for s in series if s.labels["tenant"] == OTHER_TENANT]
    assert other == [sum(sorted(served.values())[: len(served) - MAX_TENANT_LABELS])]


def test_priority_bands_are_a_fixed_small_set():
    assert {priority_band(p) for p in (-(2**63), -1, 0, 1, 2**63 - 1)} == {"lt0", "0", "gt0"}

"""Tracing end to end over real OTLP/HTTP: a gateway (in this process, `otel_endpoint` set) in
front of a `loragate engine` process (`--otel-endpoint`), both exporting to a local OTLP
receiver (an HTTP server here decoding `ExportTraceServiceRequest` protobuf). One request is one
trace id holding the gateway's spans and the engine's, the engine's request span the child of
the gateway's engine call (linked by the `traceparent` header alone: two processes); the
tenant's id is in no byte the collector receives. (tests/vllm/test_tracing_on_vllm.py: the same
over a vLLM server.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_processes import EngineProcess, start_engines
from gateway_harness import gateway_settings, running_gateway
from otlp_receiver import Receiver

from gateway.telemetry.metrics import tenant_series_label

GATEWAY_SPANS = {"gateway.request", "gateway.auth", "gateway.admission", "gateway.engine",
                 "gateway.settle"}  # fmt: skip
ENGINE_SPANS = {"engine.request", "engine.queue", "engine.prefill", "engine.decode"}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture
def engine(
    tiny_model_dir: Path, tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EngineProcess]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not 5
    [proc] = start_engines(tiny_model_dir, tmp_path, 1, "--otel-endpoint", receiver.url)
    try:
        yield proc
    finally:
        proc.kill()


async def test_one_request_is_one_trace_across_two_processes(
    tiny_model_dir: Path, tmp_path: Path, receiver: Receiver, engine: EngineProcess
) -> None:
    settings = gateway_settings(
        tiny_model_dir, tmp_path, engine_mode="http", engine_urls=[engine.url],
        otel_endpoint=receiver.url,
    )  # fmt: skip
    async with running_gateway(settings) as gateway:
        tenant = await gateway.tenant()
        body = gateway.chat_body("Trace this one request.", max_tokens=5, ignore_eos=True)
        response = await gateway.client.post(
            "/v1/chat/completions", headers=tenant.headers, json=body
        )
        assert response.status_code == 200
    # the gateway's spans were flushed at its shutdown; the engine exports on its own schedule
    deadline = time.monotonic() + 30
    while not receiver.names() >= ENGINE_SPANS and time.monotonic() < deadline:
        time.sleep(0.1)
    spans = {span.name: span for span in receiver.spans}
    assert len(spans) == len(receiver.spans), sorted(s.name for s in receiver.spans)
    assert set(spans) == GATEWAY_SPANS | ENGINE_SPANS
    assert {spans[name].service for name in GATEWAY_SPANS} == {"loragate-gateway"}
    assert {spans[name].service for name in ENGINE_SPANS} == {"loragate-engine"}
    assert len({span.trace_id for span in spans.values()}) == 1
    root = spans["gateway.request"]
    assert root.parent_id == ""
    assert spans["engine.request"].parent_id == spans["gateway.engine"].span_id
    for name in GATEWAY_SPANS - {"gateway.request"}:
        assert spans[name].parent_id == root.span_id
    for name in ENGINE_SPANS - {"engine.request"}:
        assert spans[name].parent_id == spans["engine.request"].span_id
    label = tenant_series_label(tenant.tenant_id)
    assert label in root.attributes["loragate.tenant"]
    assert label in spans["engine.request"].attributes["loragate.tenant"]
    assert not any(tenant.tenant_id.encode() in body for body in receiver.bodies)

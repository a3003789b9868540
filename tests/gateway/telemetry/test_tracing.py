"""The gateway's spans (gateway/telemetry/tracing.py), in the SDK's in-memory exporter: one
inference request is one trace, `gateway.request` over auth, admission, the engine call and
settlement, the embedded engine's spans under the engine call; refusals end it with the
error's code; the tenant only as its digest. Off (the default), nothing is traced and no
`traceparent` goes to the engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.telemetry.metrics import tenant_series_label
from gateway.telemetry.tracing import Tracing
from tests.gateway.gateway_harness import Gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

GATEWAY_PHASES = ["gateway.auth", "gateway.admission", "gateway.engine", "gateway.settle"]
ENGINE_PHASES = {"engine.queue", "engine.prefill", "engine.decode"}


@pytest_asyncio.fixture(loop_scope="module")
async def spans(gateway: Gateway) -> AsyncIterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider.get_tracer("test"))
    state = gateway.state
    state.tracing = state.lifecycle.tracing = tracing
    tracing.instrument(state.engine)
    try:
        yield exporter
    finally:
        state.tracing = state.lifecycle.tracing = None
        state.engine.use_tracer(None)  # type: ignore[attr-defined]
        provider.shutdown()


async def finished_trace(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    """The spans once the request's root has ended (the run ends it after the answer)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = exporter.get_finished_spans()
        if any(span.name == "gateway.request" for span in found):
            await asyncio.sleep(0.05)  # an engine span ends just before, never after
            return list(exporter.get_finished_spans())
        await asyncio.sleep(0.01)
    raise AssertionError(f"no gateway.request span: {[s.name for s in found]}")


def one(found: list[ReadableSpan], name: str) -> ReadableSpan:
    [span] = [span for span in found if span.name == name]
    return span


def attribute_values(found: list[ReadableSpan]) -> list[str]:
    return [str(value) for span in found for value in (span.attributes or {}).values()]


@pytest.mark.parametrize("stream", [False, True])
async def test_one_request_is_one_trace_across_gateway_and_engine(
    gateway: Gateway, spans: InMemorySpanExporter, stream: bool
) -> None:
    tenant = await gateway.tenant()
    recorder = gateway.record_requests()
    try:
        body = gateway.chat_body("trace me", max_tokens=4, stream=stream)
        response = await gateway.client.post(
            "/v1/chat/completions", headers=tenant.headers, json=body
        )
    finally:
        gateway.stop_recording(recorder)
    assert response.status_code == 200
    found = await finished_trace(spans)
    assert len({span.context.trace_id for span in found}) == 1
    names = sorted(span.name for span in found)
    assert names == sorted(["gateway.request", *GATEWAY_PHASES, "engine.request", *ENGINE_PHASES])
    root = one(found, "gateway.request")
    assert root.parent is None and root.kind is SpanKind.SERVER
    for name in GATEWAY_PHASES:
        assert one(found, name).parent.span_id == root.context.span_id  # type: ignore[union-attr]
    call = one(found, "gateway.engine")
    assert call.kind is SpanKind.CLIENT
    engine = one(found, "engine.request")
    assert engine.parent is not None and engine.parent.span_id == call.context.span_id
    for name in ENGINE_PHASES:
        assert one(found, name).parent.span_id == engine.context.span_id  # type: ignore[union-attr]
    # the engine was sent the engine call's traceparent
    [traceparent] = recorder.traceparents
    assert traceparent is not None
    version, trace_id, parent_id, flags = traceparent.split("-")
    assert (version, trace_id, parent_id) == (
        "00",
        f"{call.context.trace_id:032x}",
        f"{call.context.span_id:016x}",
    )
    assert int(flags, 16) & 1  # sampled: the engine records its spans too
    # the phases in order, inside the request
    auth, admission, _, settle = (one(found, name) for name in GATEWAY_PHASES)
    assert root.start_time <= auth.start_time <= auth.end_time <= admission.start_time
    assert admission.end_time <= call.start_time <= engine.start_time
    assert engine.end_time <= call.end_time <= settle.start_time <= settle.end_time <= root.end_time
    attributes = dict(root.attributes or {})
    label = tenant_series_label(tenant.tenant_id)
    assert attributes["loragate.tenant"] == label == (engine.attributes or {})["loragate.tenant"]
    assert attributes["loragate.finish_reason"] == "length"
    assert attributes["loragate.completion_tokens"] == 4
    assert attributes["loragate.stream"] is stream
    assert attributes["http.route"] == "/v1/chat/completions"
    assert attributes["loragate.request_id"] == recorder.requests[0].request_id
    assert not any(tenant.tenant_id in value for value in attribute_values(found))
    assert all(span.status.status_code is StatusCode.UNSET for span in found)


async def test_a_bad_key_is_a_trace_of_its_own(
    gateway: Gateway, spans: InMemorySpanExporter
) -> None:
    body = gateway.chat_body("no key", max_tokens=2)
    headers = {"authorization": "Bearer lg-not-a-real-key"}
    response = await gateway.client.post("/v1/chat/completions", headers=headers, json=body)
    assert response.status_code == 401
    found = await finished_trace(spans)
    assert sorted(span.name for span in found) == ["gateway.auth", "gateway.request"]
    root, auth = one(found, "gateway.request"), one(found, "gateway.auth")
    assert auth.parent.span_id == root.context.span_id  # type: ignore[union-attr]
    assert root.status.status_code is StatusCode.ERROR is auth.status.status_code
    assert (root.attributes or {})["loragate.error"] == "invalid_api_key"
    assert (root.attributes or {})["http.response.status_code"] == 401
    assert "loragate.tenant" not in (root.attributes or {})
    assert (root.attributes or {})["http.route"] == "/v1/chat/completions"
    # a path with a client's text in it is named by its route's template
    spans.clear()
    response = await gateway.client.get("/v1/models/no-key-here", headers=headers)
    assert response.status_code == 401
    found = await finished_trace(spans)
    route = (one(found, "gateway.request").attributes or {})["http.route"]
    assert route == "/v1/models/{model_id:path}"


async def test_a_refusal_at_admission_ends_the_trace_there(
    gateway: Gateway, spans: InMemorySpanExporter
) -> None:
    tenant = await gateway.tenant(requests_per_minute=1)
    body = gateway.chat_body("once", max_tokens=2)
    first = await gateway.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
    assert first.status_code == 200
    await finished_trace(spans)
    spans.clear()
    second = await gateway.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
    assert second.status_code == 429
    found = await finished_trace(spans)
    assert sorted(span.name for span in found) == [
        "gateway.admission", "gateway.auth", "gateway.request"]  # fmt: skip
    admission = one(found, "gateway.admission")
    assert admission.status.status_code is StatusCode.ERROR
    assert (one(found, "gateway.request").attributes or {})["loragate.error"] == (
        "rate_limit_exceeded"
    )


async def test_a_refusal_before_the_run_ends_the_trace(
    gateway: Gateway, spans: InMemorySpanExporter
) -> None:
    tenant = await gateway.tenant()
    body = {**gateway.chat_body("which model", max_tokens=2), "model": "no-such-model"}
    response = await gateway.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
    assert response.status_code == 404
    found = await finished_trace(spans)
    assert sorted(span.name for span in found) == ["gateway.auth", "gateway.request"]
    root = one(found, "gateway.request")
    assert root.status.status_code is StatusCode.ERROR
    assert (root.attributes or {})["loragate.error"] == "model_not_found"
    assert (root.attributes or {})["loragate.tenant"] == tenant_series_label(tenant.tenant_id)


async def test_off_by_default_nothing_is_traced_nor_sent(gateway: Gateway) -> None:
    assert gateway.state.settings.otel_endpoint is None
    assert gateway.state.tracing is None and gateway.state.lifecycle.tracing is None
    assert Tracing.from_settings(gateway.state.settings) is None
    tenant = await gateway.tenant()
    recorder = gateway.record_requests()
    try:
        body = gateway.chat_body("untraced", max_tokens=2)
        response = await gateway.client.post(
            "/v1/chat/completions", headers=tenant.headers, json=body
        )
    finally:
        gateway.stop_recording(recorder)
    assert response.status_code == 200
    assert recorder.traceparents == [None]

"""The engine server's spans (engine/protocol/tracing.py): one `engine.request` per request,
the child of the caller's `traceparent`, with its queue, prefill and decode phases; the tenant
only as its digest. Off (no tracer), the app has nothing to trace with. Through httpx's ASGI
transport, the spans in the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import uvicorn
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from engine.loop.async_engine import AsyncEngine
from engine.protocol import tenant_label
from engine.server import create_app
from tests.engine.loop.async_helpers import TIMEOUT_S
from tests.engine.server.server_helpers import GENERATE, LONG, gen_body, read_events, wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
TENANT = "tenant-7f3a-secret-id"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
async def traced(engine: AsyncEngine, provider: TracerProvider) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine, tracer=provider.get_tracer("test"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://engine", timeout=TIMEOUT_S
    ) as http:
        yield http


@pytest.fixture
async def traced_url(engine: AsyncEngine, provider: TracerProvider) -> AsyncIterator[str]:
    """A real uvicorn (a client can leave mid-stream), tracing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    app = create_app(engine, tracer=provider.get_tracer("test"))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    await asyncio.wait_for(task, TIMEOUT_S)
    sock.close()


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_is_one_server_span_under_the_callers_traceparent(
    traced: httpx.AsyncClient, exporter: InMemorySpanExporter, stream: bool
) -> None:
    body = gen_body(max_tokens=6, request_id="traced-1", fairness_key=TENANT, stream=stream)
    response = await traced.post(GENERATE, json=body, headers={"traceparent": TRACEPARENT})
    assert response.status_code == 200
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"engine.request", "engine.queue", "engine.prefill", "engine.decode"}
    root = spans["engine.request"]
    assert root.kind is SpanKind.SERVER
    assert root.parent is not None and root.parent.is_remote
    assert f"{root.parent.span_id:016x}" == PARENT_ID
    for span in spans.values():
        assert f"{span.context.trace_id:032x}" == TRACE_ID
    for name in ("engine.queue", "engine.prefill", "engine.decode"):
        assert spans[name].parent is not None
        assert spans[name].parent.span_id == root.context.span_id
    # the phases follow each other inside the request
    queue, prefill, decode = spans["engine.queue"], spans["engine.prefill"], spans["engine.decode"]
    assert root.start_time == queue.start_time
    assert queue.end_time == prefill.start_time and prefill.end_time == decode.start_time
    assert decode.end_time == root.end_time and root.start_time < root.end_time
    attributes = dict(root.attributes or {})
    assert attributes["loragate.tenant"] == tenant_label(TENANT)
    assert attributes["loragate.request_id"] == "traced-1"
    assert attributes["loragate.finish_reason"] == "length"
    assert attributes["loragate.prompt_tokens"] == 5
    assert attributes["loragate.output_tokens"] == 6
    every_value = [str(v) for span in spans.values() for v in (span.attributes or {}).values()]
    assert not any(TENANT in value for value in every_value)


async def test_a_client_that_leaves_ends_the_trace_with_its_phases(
    traced_url: str, exporter: InMemorySpanExporter
) -> None:
    body = gen_body(LONG, stream=True, fairness_key=TENANT)
    async with (
        httpx.AsyncClient(base_url=traced_url, timeout=TIMEOUT_S) as http,
        http.stream("POST", GENERATE, json=body, headers={"traceparent": TRACEPARENT}) as response,
    ):
        events = read_events(response)
        await anext(events)
        await anext(events)  # decoding
    # leaving the block closed the connection mid-stream
    await wait_until(lambda: len(exporter.get_finished_spans()) == 4)
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"engine.request", "engine.queue", "engine.prefill", "engine.decode"}
    root = spans["engine.request"]
    attributes = dict(root.attributes or {})
    assert attributes["loragate.finish_reason"] == "abort"
    assert 2 <= int(attributes["loragate.output_tokens"]) < LONG  # type: ignore[arg-type]
    assert spans["engine.decode"].end_time == root.end_time
    assert f"{root.context.trace_id:032x}" == TRACE_ID


async def test_without_a_traceparent_the_engine_span_is_a_root(
    traced: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    response = await traced.post(GENERATE, json=gen_body(max_tokens=2))
    assert response.status_code == 200
    root = by_name(exporter.get_finished_spans())["engine.request"]
    assert root.parent is None


async def test_a_malformed_traceparent_is_ignored(
    traced: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    headers = {"traceparent": "00-not-a-trace-id-01"}
    response = await traced.post(GENERATE, json=gen_body(max_tokens=2), headers=headers)
    assert response.status_code == 200
    assert by_name(exporter.get_finished_spans())["engine.request"].parent is None


async def test_a_refused_request_has_no_span(
    traced: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    response = await traced.post(GENERATE, json=gen_body(max_tokens=0))
    assert response.status_code == 400
    assert exporter.get_finished_spans() == ()


async def test_off_the_app_holds_no_tracer(client: httpx.AsyncClient) -> None:
    transport = client._transport
    assert isinstance(transport, httpx.ASGITransport)
    assert transport.app.state.tracer is None  # type: ignore[attr-defined]
    response = await client.post(GENERATE, json=gen_body(max_tokens=2), headers={
        "traceparent": TRACEPARENT
    })  # fmt: skip
    assert response.status_code == 200

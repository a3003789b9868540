"""Tracing on both sides of the wire (docs/operations.md, "Tracing"): OpenTelemetry spans,
exported by OTLP/HTTP, off unless an endpoint is configured.

A request's trace crosses the wire as a W3C `traceparent` header: the gateway sends its
engine-call span's, and the engine's request span is that span's child (vLLM reads the same
header). Off, nothing here runs and the tracing part of the OpenTelemetry SDK and its exporter
are never imported: each side holds None where a tracer would be and tests it with one `if` per
request; on, they are imported when the tracer is built. (FastAPI imports the OpenTelemetry API
for instrumentation of its own, which stays off: no provider here is ever the global one.)

Span times come from the clocks each side already reads (time.perf_counter in the gateway, the
engine's monotonic `RequestTimes`), converted to the epoch where a span is built (`to_epoch`).
The engine's spans are built once its request has ended, from timestamps its step loop records
for the metrics anyway (`EngineTrace`): the loop itself does no tracing work.

Tenants appear in span attributes only as their metric label (`tenant_label`, a digest), never
by id, as on /metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from engine.outputs import RequestOutput, RequestTimes
from engine.protocol.labels import tenant_label
from engine.request import EngineRequest

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

TRACEPARENT = "traceparent"
TENANT_ATTRIBUTE = "loragate.tenant"
INSTRUMENTATION = "loragate"


def build_provider(endpoint: str, *, service_name: str) -> TracerProvider:
    """A tracer provider exporting in batches to the OTLP/HTTP traces `endpoint` (a collector's
    `http://host:4318/v1/traces`). The exporter's other standard variables (headers, timeout,
    certificates: OTEL_EXPORTER_OTLP_*) and the sampler's (OTEL_TRACES_SAMPLER) apply. Not the
    global provider: each app holds its own, and shuts it down (flushing) when it stops."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def tracer_for(endpoint: str | None, *, service_name: str) -> Tracer | None:
    """A process's tracer, None when no endpoint is configured (tracing off). Its provider
    flushes the spans still queued when the process exits (the SDK's exit hook)."""
    if not endpoint:
        return None
    return build_provider(endpoint, service_name=service_name).get_tracer(INSTRUMENTATION)


def to_epoch(clock: Callable[[], float]) -> Callable[[float], int]:
    """Readings of `clock` (seconds) -> epoch nanoseconds, as spans take them."""
    offset = time.time_ns() - int(clock() * 1e9)
    return lambda at: offset + int(at * 1e9)


def parent_context(traceparent: str | None) -> Context | None:
    """The remote span a `traceparent` names (None: the span is a trace's root). A malformed
    header is ignored, as the W3C spec asks."""
    if not traceparent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({TRACEPARENT: traceparent})


def traceparent_of(span: Span) -> str:
    """The `traceparent` header that makes the receiver's spans children of `span`."""
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
    return carrier[TRACEPARENT]


class EngineTrace:
    """One engine request's spans, built when it ends (`end`):

        engine.request   arrival -> finished (server span; parent: the caller's traceparent)
          engine.queue     arrival -> first scheduled
          engine.prefill   first scheduled -> first token
          engine.decode    first token -> finished

    A phase that never began (the request ended while queued) has no span. The final output
    ends it (`observe`), or else the stream's close (`end`: the client left; its phases run to
    then). Per output while it runs: one assignment."""

    def __init__(self, tracer: Tracer, request: EngineRequest, headers: Mapping[str, str]) -> None:
        """`headers`: the HTTP request's (its `traceparent`, if any, is the parent)."""
        self._tracer = tracer
        self._traceparent = headers.get(TRACEPARENT)
        self._arrival = request.arrival_time  # the output's times replace it when there are any
        self._attributes: dict[str, str | int] = {
            "loragate.request_id": request.request_id,
            TENANT_ATTRIBUTE: tenant_label(request.tenant_key),
            "loragate.n": request.sampling_params.n,
            "loragate.priority": request.priority,
        }
        self._last: RequestOutput | None = None
        self._is_ended = False

    def observe(self, output: RequestOutput, finish_reason: Callable[[RequestOutput], str]) -> None:
        """Each output as it is read; the final one ends the trace with its reason."""
        self._last = output
        if output.finished:
            self.end(str(finish_reason(output)))

    def end(self, finish_reason: str) -> None:
        """Build and end the spans (once; later calls do nothing), from the last output seen:
        its times (the engine's own) and counts."""
        if self._is_ended:
            return
        self._is_ended = True
        from opentelemetry.trace import SpanKind, StatusCode, set_span_in_context

        now = time.monotonic()
        epoch = to_epoch(time.monotonic)
        output = self._last
        times = output.times if output is not None else None
        if times is None:
            times = RequestTimes(arrival=self._arrival)
        finished = times.finished if times.finished is not None else now
        attributes = dict(self._attributes)
        attributes["loragate.finish_reason"] = finish_reason
        if output is not None:
            attributes["loragate.prompt_tokens"] = output.num_prompt_tokens
            attributes["loragate.cached_tokens"] = output.num_cached_tokens
            attributes["loragate.output_tokens"] = output.num_output_tokens
        root = self._tracer.start_span(
            "engine.request",
            context=parent_context(self._traceparent),
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=epoch(times.arrival),
        )
        if finish_reason == "error":
            root.set_status(StatusCode.ERROR)
        inside = set_span_in_context(root)
        marks = [times.arrival, times.first_scheduled, times.first_token, finished]
        for name, start, stop in zip(
            ("engine.queue", "engine.prefill", "engine.decode"), marks, marks[1:], strict=False
        ):
            if start is None:
                break
            span = self._tracer.start_span(name, context=inside, start_time=epoch(start))
            span.end(end_time=epoch(stop if stop is not None else finished))
        root.end(end_time=epoch(finished))

"""The gateway's spans (docs/operations.md, "Tracing"): one trace per inference request.

    gateway.request       arrival -> the run's end (server span)
      gateway.auth          the API key's check
      gateway.admission     the quota store's admission
      gateway.engine        the engine requests, opened to their last event (client span); its
                            `traceparent` goes to the engine, whose spans are its children
      gateway.settle        the quota settlement and the usage record

Off (`LORAGATE_OTEL_ENDPOINT` unset), the state holds no `Tracing` and no request a
`RequestTrace`: what runs per request is an `is not None` test at each of the places above, and
the SDK's tracing is never imported. The shared mechanics (the exporter, the header, the
clocks) are engine/protocol/tracing.py's, so both sides of the wire trace alike.

A trace has the request's owners: the lifecycle begins it once the key is checked and ends it
if the request is refused before it runs (`refused`); from then on its `Run` carries it through
admission, the engine call and settlement, and ends it last. A request refused at the key check
is a trace of its own (`Tracing.refused_at_auth`). The tenant appears as its metric label
(`tenant_series_label`, a digest), never by id; errors by their code, never their message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from engine.protocol import INSTRUMENTATION, TENANT_ATTRIBUTE, build_provider, to_epoch
from engine.protocol import traceparent_of as _traceparent_of
from gateway.settings import GatewaySettings
from gateway.telemetry.metrics import tenant_series_label
from tenancy.errors import ClientError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

SERVICE_NAME = "loragate-gateway"


def route_of(scope: Mapping[str, Any]) -> str:
    """The matched route's template (`/v1/models/{model_id:path}`) where FastAPI leaves it in
    the scope (0.165 does not for every route: not for the inference POSTs), else the path: of
    the routes that authenticate tenants, only that one has a client's text in its path."""
    route = scope.get("route")
    return str(route.path) if route is not None else str(scope["path"])


def _error_code(error: BaseException) -> str:
    if isinstance(error, ClientError):
        return error.code or error.error_type
    return type(error).__name__


class RequestTrace:
    """One request's spans: the root and the phase under way (one at a time)."""

    def __init__(self, tracer: Tracer, root: Span, *, phase: Span | None = None) -> None:
        self._tracer = tracer
        self._root = root
        self._phase = phase
        self._is_ended = False

    @property
    def root(self) -> Span:
        return self._root

    def phase(self, name: str, *, is_client: bool = False) -> None:
        """End the phase under way (if any) and start `name`."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        self.end_phase()
        kind = SpanKind.CLIENT if is_client else SpanKind.INTERNAL
        self._phase = self._tracer.start_span(
            name, context=set_span_in_context(self._root), kind=kind
        )

    def end_phase(self) -> None:
        if self._phase is not None:
            self._phase.end()
            self._phase = None

    def traceparent(self) -> str:
        """The header that makes the engine's spans children of the phase under way."""
        assert self._phase is not None, "traceparent() inside a phase (the engine call)"
        return _traceparent_of(self._phase)

    def named(self, *, request_id: str, model: str, is_streamed: bool) -> None:
        self._root.set_attributes(
            {"loragate.request_id": request_id, "loragate.model": model,
             "loragate.stream": is_streamed}
        )  # fmt: skip

    def fail(self, error: BaseException | str) -> None:
        """Mark the phase under way and the request failed (by code, never the message)."""
        from opentelemetry.trace import StatusCode

        code = error if isinstance(error, str) else _error_code(error)
        for span in (self._phase, self._root):
            if span is not None:
                span.set_status(StatusCode.ERROR, code)
        self._root.set_attribute("loragate.error", code)
        if isinstance(error, ClientError):
            self._root.set_attribute("http.response.status_code", error.status_code)

    def settled(self, *, finish_reason: str, num_prompt: int, num_completion: int) -> None:
        self._root.set_attributes(
            {"loragate.finish_reason": finish_reason, "loragate.prompt_tokens": num_prompt,
             "loragate.completion_tokens": num_completion}
        )  # fmt: skip

    def refused(self, error: BaseException) -> None:
        """The request ended before it ran (no model, a 4xx of planning, shutdown)."""
        self.fail(error)
        self.end()

    def end(self) -> None:
        if self._is_ended:
            return
        self._is_ended = True
        self.end_phase()
        self._root.end()


class Tracing:
    """The gateway's tracer; None on the state when tracing is off."""

    def __init__(self, tracer: Tracer, provider: TracerProvider | None = None) -> None:
        self._tracer = tracer
        self._provider = provider  # shut down (its queue flushed) at close; tests pass none

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Tracing | None:
        if not settings.otel_endpoint:
            return None
        provider = build_provider(settings.otel_endpoint, service_name=SERVICE_NAME)
        return cls(provider.get_tracer(INSTRUMENTATION), provider)

    def _root(self, epoch: Callable[[float], int], started: float, path: str) -> Span:
        from opentelemetry.trace import SpanKind

        return self._tracer.start_span(
            "gateway.request",
            kind=SpanKind.SERVER,
            start_time=epoch(started),
            attributes={"http.route": path},
        )

    def _auth(
        self, epoch: Callable[[float], int], root: Span, began: float, ended: float | None
    ) -> Span:
        from opentelemetry.trace import set_span_in_context

        span = self._tracer.start_span(
            "gateway.auth", context=set_span_in_context(root), start_time=epoch(began)
        )
        if ended is not None:
            span.end(end_time=epoch(ended))
        return span

    def begin(
        self, *, started: float, auth: tuple[float, float] | None, path: str, tenant_id: str
    ) -> RequestTrace:
        """A request's trace from its arrival (`started`, perf_counter) and its key check's
        times (None: not timed)."""
        epoch = to_epoch(time.perf_counter)  # per request: the two clocks drift apart
        root = self._root(epoch, started, path)
        root.set_attribute(TENANT_ATTRIBUTE, tenant_series_label(tenant_id))
        if auth is not None:
            self._auth(epoch, root, *auth)
        return RequestTrace(self._tracer, root)

    def refused_at_auth(
        self, *, started: float, auth_began: float, path: str, error: Exception
    ) -> None:
        """A request the key check refused: its trace, complete (no tenant: none was found)."""
        epoch = to_epoch(time.perf_counter)
        root = self._root(epoch, started, path)
        trace = RequestTrace(self._tracer, root, phase=self._auth(epoch, root, auth_began, None))
        trace.refused(error)

    def instrument(self, engine: object) -> None:
        """An embedded engine records its spans with this tracer (`use_tracer`, in-process
        only); an HTTP engine records its own, in its process."""
        use_tracer = getattr(engine, "use_tracer", None)
        if use_tracer is not None:
            use_tracer(self._tracer)

    async def close(self) -> None:
        if self._provider is not None:  # blocks while it exports what is queued
            await asyncio.to_thread(self._provider.shutdown)

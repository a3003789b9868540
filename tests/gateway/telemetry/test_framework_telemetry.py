"""The gateway's FastAPI app makes no spans of its own when a global OpenTelemetry provider is
set (FastAPI 0.16x instruments requests itself then): the gateway's tracing has its own provider,
and the framework's spans would double every request's. Each case runs in a fresh interpreter,
since a global provider can be set only once per process."""

from __future__ import annotations

import subprocess
import sys

import fastapi
import pytest

from gateway.app import NO_FRAMEWORK_TELEMETRY

SCRIPT = """
import sys
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import NO_FRAMEWORK_TELEMETRY

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
app = FastAPI(**(NO_FRAMEWORK_TELEMETRY if sys.argv[1] == "gateway" else {}))
app.get("/ping")(lambda: {"ok": True})
assert TestClient(app).get("/ping").json() == {"ok": True}
print(len(exporter.get_finished_spans()))
"""


def _spans(kind: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    not NO_FRAMEWORK_TELEMETRY,
    reason=f"FastAPI {fastapi.__version__} has no request instrumentation of its own",
)
def test_the_gateway_app_makes_no_framework_spans() -> None:
    assert _spans("plain") > 0  # the control: a plain app does trace under a global provider
    assert _spans("gateway") == 0

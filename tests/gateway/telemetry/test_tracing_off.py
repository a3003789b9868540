"""Tracing off (the default) costs no import: a gateway process whose settings name no OTLP
endpoint, and an engine server built without a tracer, never import the OpenTelemetry SDK's
tracing or its exporter (so no provider, no batch thread; FastAPI imports the API). Checked by the modules a fresh interpreter holds after
building both apps and the gateway's tracing from its settings."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.settings import GatewaySettings

PROBE = """
import json, sys
from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.telemetry.tracing import Tracing
import gateway.deps, gateway.lifecycle.run, gateway.engines.http, gateway.engines.inprocess
import engine.server, engine.cli

settings = GatewaySettings(model=sys.argv[1], key_pepper=sys.argv[2], salt_secret=sys.argv[3])
assert Tracing.from_settings(settings) is None
create_app(settings)
print(json.dumps(sorted(sys.modules)))
"""


def test_off_no_opentelemetry_module_is_imported(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LORAGATE_OTEL_ENDPOINT", raising=False)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tiny_model_dir), secrets.token_urlsafe(32),
         secrets.token_urlsafe(32)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert "gateway.telemetry.tracing" in modules and "engine.server" in modules
    # (redis-py imports the SDK's metrics package, when installed, for instrumentation of its
    # own; tracing's part of the SDK, the exporter and protobuf stay out.)
    tracing = ("opentelemetry.sdk.trace", "opentelemetry.exporter", "opentelemetry.proto",
               "google.protobuf")  # fmt: skip
    assert [m for m in modules if m.startswith(tracing)] == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", None), ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces")],
)
def test_the_endpoint_setting(tiny_model_dir: Path, value: str, expected: str | None) -> None:
    settings = GatewaySettings(  # type: ignore[call-arg]
        model=tiny_model_dir, key_pepper=secrets.token_urlsafe(32),
        salt_secret=secrets.token_urlsafe(32), otel_endpoint=value,
    )  # fmt: skip
    assert settings.otel_endpoint == expected


def test_an_endpoint_that_is_not_http_is_refused_by_name(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="otel_endpoint"):
        GatewaySettings(  # type: ignore[call-arg]
            model=tiny_model_dir, key_pepper=secrets.token_urlsafe(32),
            salt_secret=secrets.token_urlsafe(32), otel_endpoint="collector:4317",
        )  # fmt: skip

"""Tracing over vLLM (issue 45): the gateway sends vLLM its engine call's `traceparent` (the
same HTTP client as for loragate's engines), and a vLLM server run with
`--otlp-traces-endpoint` makes its request span a child of that call: one request is one trace
across the gateway and vLLM, both exporting to a local OTLP/HTTP receiver."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from otlp_receiver import Receiver
from vllm_servers import require_vllm, start_vllm

from tests.gateway.gateway_harness import gateway_settings, running_gateway

pytestmark = pytest.mark.vllm


async def test_vllm_spans_join_the_gateways_trace(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_vllm()
    receiver = Receiver()
    # vLLM's exporter speaks gRPC unless told otherwise; export within 0.1 s, not 5
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    try:
        [server] = start_vllm(tiny_model_dir, tmp_path, 1, ("--otlp-traces-endpoint", receiver.url))
        try:
            settings = gateway_settings(
                tiny_model_dir, tmp_path, engine_mode="http", engine_kind="vllm",
                engine_urls=[server.url], otel_endpoint=receiver.url,
            )  # fmt: skip
            async with running_gateway(settings) as gateway:
                tenant = await gateway.tenant()
                body = gateway.chat_body("Trace this on vLLM.", max_tokens=4)
                response = await gateway.client.post(
                    "/v1/chat/completions", headers=tenant.headers, json=body
                )
                assert response.status_code == 200
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                span.service != "loragate-gateway" for span in receiver.spans
            ):
                time.sleep(0.1)
        finally:
            server.stop()
    finally:
        receiver.close()
    [call] = [span for span in receiver.spans if span.name == "gateway.engine"]
    from_vllm = [span for span in receiver.spans if span.service != "loragate-gateway"]
    children = [span for span in from_vllm if span.parent_id == call.span_id]
    assert len(children) == 1, [(s.service, s.name, s.parent_id) for s in from_vllm]
    assert children[0].trace_id == call.trace_id

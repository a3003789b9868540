"""A local OTLP/HTTP traces endpoint for the tracing tests (tests/gateway/telemetry,
tests/vllm): an HTTP server on a free loopback port that decodes each export
(`ExportTraceServiceRequest` protobuf) into its spans and keeps the raw bodies too. The tests
reach it by name (tests/conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass(frozen=True)
class Received:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, str]


class Receiver:
    """An OTLP/HTTP traces endpoint: every export's raw body and its spans."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.spans: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.add(self.path, self.headers.get("content-type", ""), body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")  # an empty ExportTraceServiceResponse
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def add(self, path: str, content_type: str, body: bytes) -> None:
        assert path == "/v1/traces" and content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(body)
        found = []
        for resource_spans in export.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(Received(
                        service=resource["service.name"], name=span.name,
                        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        attributes={a.key: str(a.value).strip() for a in span.attributes},
                    ))  # fmt: skip
        with self._lock:
            self.bodies.append(body)
            self.spans.extend(found)

    def names(self) -> set[str]:
        with self._lock:
            return {span.name for span in self.spans}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

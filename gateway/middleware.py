"""Every HTTP request's one pass at the gateway's edge, in one pure ASGI layer (no body
buffering): three layers before (trusted hosts, request context, the catch-all), each with its
own call and send wrapper on every request (issue 48: the middleware stack was a third of a
request's CPU).

- Host: a request whose Host header is not one of `hosts` gets a 400 (OpenAI shape) before any
  route sees it; `["*"]` accepts any. Nothing the gateway answers is built from the Host header
  (no redirects), so this is about not serving names it does not own.
- Context: `x-request-id` (the client's, if it is a sane token) and `x-loragate-overhead-ms` on
  every response (routes that call an engine set the latter themselves, engine time excluded;
  everything else was spent in the gateway).
- The last resort: an exception no handler took becomes a constant 500 (the traceback's frames
  logged, never the message: it may quote request data); once the answer has started the
  client sees it cut instead.
"""

from __future__ import annotations

import logging
import re
import time
import traceback
import uuid
from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.error_handlers import error_response
from tenancy.errors import ClientError

log = logging.getLogger(__name__)

_SANE_ID = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")
_REQUEST_ID = b"x-request-id"
_OVERHEAD = b"x-loragate-overhead-ms"
_INVALID_HOST = (
    b'{"error":{"message":"This host name is not served here.",'
    b'"type":"invalid_request_error","param":null,"code":"invalid_host"}}'
)


def sane_request_id(raw: bytes | None) -> str:
    """The client's id if it is a short token of safe characters, else a fresh one: the one id
    the response header, the logs and the audit log all carry."""
    if raw is not None and _SANE_ID.fullmatch(raw):
        return raw.decode()
    return f"req_{uuid.uuid4().hex}"


class EdgeMiddleware:
    def __init__(self, app: ASGIApp, *, hosts: list[str]) -> None:
        self.app = app
        self._hosts = {h.lower() for h in hosts}
        self._any = "*" in self._hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        client_id: bytes | None = None
        host = b""
        for name, value in scope["headers"]:  # one walk for both headers
            if name == _REQUEST_ID:
                client_id = value
            elif name == b"host":
                host = value
        request_id = sane_request_id(client_id)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["started"] = started
        request_id_bytes = request_id.encode()
        answered = False

        # A plain function returning the inner send's awaitable: no coroutine of its own for
        # each of a stream's chunks, which pass through untouched.
        def send_with_context(message: Message) -> Awaitable[None]:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = True
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != _REQUEST_ID
                ]
                headers.append((_REQUEST_ID, request_id_bytes))
                if not any(k.lower() == _OVERHEAD for k, _ in headers):
                    elapsed = (time.perf_counter() - started) * 1000
                    headers.append((_OVERHEAD, f"{elapsed:.3f}".encode()))
                message = {**message, "headers": headers}
            return send(message)

        if not self._any and not self._serves(host):
            await send_with_context({"type": "http.response.start", "status": 400,
                                     "headers": [(b"content-type", b"application/json"),
                                                 (b"content-length",
                                                  str(len(_INVALID_HOST)).encode())]})  # fmt: skip
            await send_with_context({"type": "http.response.body", "body": _INVALID_HOST})
            return
        try:
            await self.app(scope, receive, send_with_context)
        except Exception as exc:
            frames = "".join(traceback.format_tb(exc.__traceback__))
            log.error("unhandled %s on %s:\n%s", type(exc).__name__, scope.get("path"), frames)
            if answered:
                return  # the answer is under way: the client sees it cut
            body = ClientError(
                message="Internal server error.", status_code=500, error_type="server_error"
            )
            await error_response(body)(scope, receive, send_with_context)

    def _serves(self, host: bytes) -> bool:
        text = host.decode("latin-1")
        name = text.rsplit(":", 1)[0] if not text.endswith("]") else text
        return name.lower() in self._hosts

"""Request context on every response: `x-request-id` (the client's, if it is a sane token) and
`x-loragate-overhead-ms` (routes that call an engine set it themselves, engine time excluded;
everything else was spent in the gateway). A pure ASGI middleware: no body buffering."""

from __future__ import annotations

import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_SANE_ID = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")
_REQUEST_ID = b"x-request-id"
_OVERHEAD = b"x-loragate-overhead-ms"


def sane_request_id(raw: bytes | None) -> str:
    """The client's id if it is a short token of safe characters, else a fresh one: the one id
    the response header, the logs and the audit log all carry."""
    if raw is not None and _SANE_ID.fullmatch(raw):
        return raw.decode()
    return f"req_{uuid.uuid4().hex}"


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = sane_request_id(
            next((value for name, value in scope["headers"] if name == _REQUEST_ID), None)
        ).encode()
        state = scope.setdefault("state", {})
        state["request_id"] = request_id.decode()
        state["started"] = started

        async def send_with_context(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != _REQUEST_ID
                ]
                headers.append((_REQUEST_ID, request_id))
                if not any(k.lower() == _OVERHEAD for k, _ in headers):
                    elapsed = (time.perf_counter() - started) * 1000
                    headers.append((_OVERHEAD, f"{elapsed:.3f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_context)


class TrustedHostMiddleware:
    """Requests whose Host header is not one of `hosts` get a 400 (OpenAI shape) before any
    route sees them; `["*"]` accepts any. Nothing the gateway answers is built from the Host
    header (no redirects), so this is about not serving names it does not own."""

    def __init__(self, app: ASGIApp, *, hosts: list[str]) -> None:
        self.app = app
        self._hosts = {h.lower() for h in hosts}
        self._any = "*" in self._hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._any or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name.lower() in self._hosts:
            await self.app(scope, receive, send)
            return
        body = (
            b'{"error":{"message":"This host name is not served here.",'
            b'"type":"invalid_request_error","param":null,"code":"invalid_host"}}'
        )
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

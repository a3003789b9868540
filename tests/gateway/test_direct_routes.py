"""The inference routes dispatched from the edge (gateway/routes/direct.py): the table is the
declared POST routes, they answer through the app's own error handlers and the edge's context,
and everything else still goes through FastAPI."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI

from gateway.routes import chat, completions, generate, responses
from gateway.routes.direct import DirectRoutes, post_endpoints
from tests.gateway.gateway_harness import MODEL, Gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

INFERENCE = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/inference/v1/generate"}


async def _direct(gateway: Gateway) -> DirectRoutes:
    """The DirectRoutes layer of the app's middleware stack (built on the first request)."""
    await gateway.client.get("/health")
    app: FastAPI = gateway.client._transport.app  # type: ignore[attr-defined]
    layer = app.middleware_stack
    while layer is not None and not isinstance(layer, DirectRoutes):
        layer = getattr(layer, "app", None)
    assert layer is not None, "DirectRoutes is not in the middleware stack"
    return layer


def test_the_table_is_the_declared_post_routes() -> None:
    table = post_endpoints(m.router for m in (chat, responses, completions, generate))
    assert set(table) == INFERENCE
    assert table["/v1/chat/completions"] is chat.chat_completions


async def test_inference_posts_are_answered_by_the_direct_layer(gateway: Gateway) -> None:
    direct = await _direct(gateway)
    calls: list[str] = []
    inner = direct.app

    async def count_fallthrough(scope, receive, send):  # type: ignore[no-untyped-def]
        calls.append(scope["path"])
        await inner(scope, receive, send)

    direct.app = count_fallthrough
    try:
        key = await gateway.tenant()
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ok = await gateway.client.post("/v1/chat/completions", json=body, headers=key.headers)
        assert ok.status_code == 200, ok.text
        assert ok.headers["x-request-id"]  # the edge's context wraps the direct layer
        assert calls == []  # FastAPI's router never saw it
        wrong = await gateway.client.get("/v1/chat/completions", headers=key.headers)
        assert wrong.status_code == 405  # another method: FastAPI's answer, in the OpenAI shape
        assert wrong.json()["error"]["code"] == "method_not_allowed"
        assert calls == ["/v1/chat/completions"]
    finally:
        direct.app = inner


async def test_errors_go_through_the_app_handlers(gateway: Gateway) -> None:
    bad_key = await gateway.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "x"}, headers={"authorization": "x"}
    )
    assert bad_key.status_code == 401
    assert bad_key.json()["error"]["code"] == "invalid_api_key"
    key = await gateway.tenant()
    not_json = await gateway.client.post(
        "/v1/chat/completions", content=b"{", headers={**key.headers, "content-type": "x"}
    )
    assert not_json.status_code == 400
    assert not_json.json()["error"]["type"] == "invalid_request_error"
    unknown_model = await gateway.client.post(
        "/v1/responses", json={"model": "nope", "input": "x"}, headers=key.headers
    )
    assert unknown_model.status_code == 404
    assert unknown_model.json()["error"]["param"] == "model"


async def test_an_unhandled_error_is_the_edge_s_constant_500(gateway: Gateway) -> None:
    direct = await _direct(gateway)
    routes = direct._routes
    original = routes["/v1/completions"]

    async def broken(*args: object) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("secret detail")

    routes["/v1/completions"] = broken  # type: ignore[assignment]
    try:
        key = await gateway.tenant()
        answer = await gateway.client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x"}, headers=key.headers
        )
    finally:
        routes["/v1/completions"] = original
    assert answer.status_code == 500
    assert answer.json()["error"]["type"] == "server_error"
    assert "secret detail" not in answer.text

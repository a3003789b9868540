"""One error boundary: every answer that is not a success has the OpenAI error shape, including
routes that do not exist and methods a route does not take."""

from __future__ import annotations

import pytest
from gateway_harness import Gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _error(body: dict[str, object]) -> dict[str, object]:
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(
    "path", ["/v1/nope", "/admin/v1/nope", "/", "/v1/chat/completions/extra", "/v1/models/"]
)
async def test_an_unknown_route_is_a_404_in_the_openai_shape(gateway: Gateway, path: str) -> None:
    tenant = await gateway.tenant()
    r = await gateway.client.get(path, headers=tenant.headers)
    if path == "/v1/models/":  # the route takes any model id: an empty one is a 404 too
        assert r.status_code == 404
        return
    assert r.status_code == 404, r.text
    error = _error(r.json())
    assert error["code"] == "unknown_route" and path in str(error["message"])


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("GET", "/v1/chat/completions", "POST"), ("DELETE", "/admin/v1/tenants", "GET, POST")],
)
async def test_a_wrong_method_is_a_405_in_the_openai_shape(
    gateway: Gateway, method: str, path: str, allowed: str
) -> None:
    r = await gateway.client.request(method, path)
    assert r.status_code == 405, r.text
    assert _error(r.json())["code"] == "method_not_allowed"
    # Starlette names the methods of the first route on the path: a subset of those allowed.
    offered = set(r.headers["allow"].split(", "))
    assert offered and offered <= set(allowed.split(", ")) and method not in offered


async def test_client_errors_of_both_layers_share_one_shape(gateway: Gateway) -> None:
    """A tenancy error (bad key) and a gateway error (bad body) answer alike."""
    r = await gateway.client.post("/v1/chat/completions", headers={"authorization": "Bearer x"})
    assert r.status_code == 401 and _error(r.json())["code"] == "invalid_api_key"
    tenant = await gateway.tenant()
    r = await gateway.client.post(
        "/v1/chat/completions", headers=tenant.headers, json={"model": "tiny"}
    )
    assert r.status_code == 400 and _error(r.json())["param"] == "messages"


async def test_no_redirect_is_built_from_the_host_header(gateway: Gateway) -> None:
    tenant = await gateway.tenant()
    for path in ("/v1/chat/completions/", "/v1/models/", "/admin/v1/tenants/", "/health/"):
        r = await gateway.client.get(
            path, headers={**tenant.headers, "host": "evil.example"}, follow_redirects=False
        )
        assert r.status_code < 300 or r.status_code >= 400, (path, r.status_code)
        assert "evil.example" not in r.headers.get("location", ""), path

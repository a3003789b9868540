"""Issue 11, acceptance 5: `/openapi.json` validates as OpenAPI 3.1 and lists every route the
app serves, with security schemes, the inference routes' bodies and an example on every admin
route (each valid against the route's own schemas); `api_docs_enabled=false` turns it off."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from fastapi.routing import APIRoute
from gateway_harness import Gateway, gateway_settings
from openapi_spec_validator import validate
from openapi_spec_validator.versions import consts as versions
from openapi_spec_validator.versions.shortcuts import get_spec_version
from starlette.routing import Route

from gateway.admin.examples import ADMIN_EXAMPLES
from gateway.app import create_app

pytestmark = pytest.mark.asyncio(loop_scope="module")

METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}


async def _doc(gateway: Gateway) -> dict[str, Any]:
    r = await gateway.client.get("/openapi.json")
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    return doc


async def test_openapi_is_valid_3_1(gateway: Gateway) -> None:
    doc = await _doc(gateway)
    assert doc["openapi"].startswith("3.1")
    assert get_spec_version(doc) == versions.OPENAPIV31
    validate(doc)  # raises on any violation of the OpenAPI 3.1 schema


def served_routes(routes: list[Any]) -> set[tuple[str, str]]:
    """(method, path) of every route the app answers, included routers walked through: plain
    routes, and FastAPI's included-router nodes (their effective routes, prefixes applied)."""
    found = set()
    for route in routes:
        if isinstance(route, Route | APIRoute):
            found |= {(m.lower(), route.path) for m in route.methods or () if m in METHODS}
        elif hasattr(route, "effective_candidates"):  # fastapi.routing._IncludedRouter
            for candidate in route.effective_candidates():
                if hasattr(candidate, "effective_candidates"):
                    found |= served_routes([candidate])
                    continue
                methods = getattr(candidate.original_route, "methods", None) or ()
                found |= {(m.lower(), candidate.path) for m in methods if m in METHODS}
    return found


async def test_every_served_route_is_listed(gateway: Gateway) -> None:
    doc = await _doc(gateway)
    app = gateway.client._transport.app  # type: ignore[attr-defined]
    # `{model_id:path}` is `{model_id}` in OpenAPI (a converter is not part of the name).
    served = {(m, re.sub(r"\{(\w+):\w+\}", r"{\1}", p)) for m, p in served_routes(app.routes)}
    # Each one answers: a request is never `unknown_route` (a 404 of a missing object is fine).
    for method, path in sorted(served):
        probe = path.replace("{tenant_id}", "x").replace("{key_id}", "x")
        probe = probe.replace("{adapter_id}", "x").replace("{name}", "x").replace("{model_id}", "x")
        r = await gateway.client.request(method.upper(), probe)
        assert r.status_code not in (405,), (method, path)
        if r.status_code == 404 and r.headers.get("content-type", "").startswith(
            "application/json"
        ):
            assert r.json()["error"]["code"] != "unknown_route", (method, path)
    listed = {(m, path) for path, ops in doc["paths"].items() for m in ops}
    assert served - listed == set()
    assert listed - served == set()
    for prefix in ("/v1/chat/completions", "/admin/v1/tenants", "/dashboard", "/docs", "/metrics"):
        assert any(path.startswith(prefix) for _, path in served), prefix


async def test_security_and_bodies(gateway: Gateway) -> None:
    doc = await _doc(gateway)
    schemes = doc["components"]["securitySchemes"]
    assert {"ApiKey", "MetricsToken", "DashboardSession"} <= set(schemes)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            names = {name for entry in op.get("security", []) for name in entry}
            if path.startswith("/admin/v1") or path.startswith("/v1/"):
                assert "ApiKey" in names, (method, path)
            assert all(p.get("name") != "authorization" for p in op.get("parameters", []))
    chat = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    ref = chat["content"]["application/json"]["schema"]["$ref"]
    assert "messages" in doc["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]


def _check(doc: dict[str, Any], schema: dict[str, Any], example: Any) -> None:
    # The refs point into the document's components: validate against the document's root.
    root = {**schema, "components": doc["components"]}
    jsonschema.Draft202012Validator(root).validate(example)


async def test_every_admin_route_has_a_valid_example(gateway: Gateway) -> None:
    doc = await _doc(gateway)
    admin_ops = {(m, p) for p, ops in doc["paths"].items() if p.startswith("/admin/v1")
                 for m in ops}  # fmt: skip
    assert admin_ops == set(ADMIN_EXAMPLES)
    for (method, path), example in ADMIN_EXAMPLES.items():
        op = doc["paths"][path][method]
        if "request" in example:
            media = op["requestBody"]["content"]["application/json"]
            assert media["example"] == example["request"]
            _check(doc, media["schema"], example["request"])
        if "response" in example:
            ok = next(a for s, a in op["responses"].items() if s.startswith("2") and "content" in a)
            media = ok["content"]["application/json"]
            assert media["example"] == example["response"]
            _check(doc, media["schema"], example["response"])


async def test_docs_page_is_served_offline(gateway: Gateway) -> None:
    r = await gateway.client.get("/docs")
    assert r.status_code == 200 and "/openapi.json" in r.text
    assert "http://" not in r.text and "https://" not in r.text  # nothing from elsewhere
    for name in ("swagger-ui-bundle.js", "swagger-ui.css"):
        assert f"/docs/static/{name}" in r.text
        asset = await gateway.client.get(f"/docs/static/{name}")
        assert asset.status_code == 200 and len(asset.content) > 10_000
    assert (await gateway.client.get("/docs/static/..%2Fapi_docs.py")).status_code == 404


async def test_switched_off(tiny_model_dir: Path, tmp_path: Path) -> None:
    app = create_app(gateway_settings(tiny_model_dir, tmp_path, api_docs_enabled=False))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        for path in ("/openapi.json", "/docs", "/docs/static/swagger-ui.css"):
            r = await client.get(path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_route"

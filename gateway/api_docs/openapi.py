"""The gateway's OpenAPI 3.1 document (`/openapi.json`, rendered at `/docs`).

FastAPI derives the paths from the routes; this adds what the routes cannot say themselves:
- security schemes, and which one each operation takes: an API key (`Authorization: Bearer
  lg_...`) on the OpenAI routes, an admin key or an OIDC access token on the admin API, the
  metrics token on `/metrics`, the dashboard's session cookie on its pages;
- the request bodies of the inference routes, which read their raw body (size-capped) and
  parse it strictly themselves, so FastAPI does not see the models;
- an example body and answer on every admin route (`gateway/admin/examples.py`).

Built once per app, on first request, without running the lifespan.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from engine.protocol import GenerateRequest
from gateway.admin import PREFIX as ADMIN_PREFIX
from gateway.admin.examples import ADMIN_EXAMPLES
from gateway.openai.responses import ResponsesRequest
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest
from tenancy.settings import TenancySettings

API_KEY = "ApiKey"
OIDC = "OidcAccessToken"
METRICS = "MetricsToken"
SESSION = "DashboardSession"
SESSION_COOKIE = "lg_session"
OPENAPI_URL = "/openapi.json"

BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("post", "/v1/chat/completions"): ChatCompletionRequest,
    ("post", "/v1/completions"): CompletionRequest,
    ("post", "/inference/v1/generate"): GenerateRequest,
    ("post", "/v1/responses"): ResponsesRequest,
}

DESCRIPTION = """\
loragate: an OpenAI-compatible gateway over a multi-LoRA engine, with per-tenant API keys,
quotas and priority tiers, and an admin REST API.

Every error is `{"error": {"message", "type", "param", "code"}}` (the OpenAI shape).
Inference routes take a key with the `inference` scope; the admin API a key with the `admin` or
`tenant-admin` scope (or, when configured, an OIDC access token). A tenant-admin sees only its
own tenant: anything else is a 404.
"""


def _schemes(settings: TenancySettings) -> dict[str, Any]:
    schemes: dict[str, Any] = {
        API_KEY: {
            "type": "http",
            "scheme": "bearer",
            "description": "A loragate API key: `inference` scope on /v1, `admin` or "
            "`tenant-admin` on /admin/v1.",
        },
        METRICS: {
            "type": "http",
            "scheme": "bearer",
            "description": "LORAGATE_METRICS_TOKEN, when it is set.",
        },
        SESSION: {
            "type": "apiKey",
            "in": "cookie",
            "name": SESSION_COOKIE,
            "description": "The dashboard's signed session, from its login form or SSO.",
        },
    }
    if settings.oidc_issuer:
        schemes[OIDC] = {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": f"An access token of {settings.oidc_issuer} for audience "
            f"{settings.oidc_audience}; roles in the `{settings.oidc_role_claim}` claim.",
        }
    return schemes


def _security(path: str, settings: TenancySettings) -> list[dict[str, list[str]]] | None:
    if path.startswith(ADMIN_PREFIX):
        return [{API_KEY: []}, {OIDC: []}] if settings.oidc_issuer else [{API_KEY: []}]
    if path.startswith(("/v1/", "/inference/")):
        return [{API_KEY: []}]
    if path == "/metrics":
        return [{METRICS: []}, {}]  # {}: no token needed when none is configured
    if path.startswith("/dashboard/") and "/static/" not in path and "login" not in path:
        return [{SESSION: []}]
    return None


def _add_bodies(doc: dict[str, Any]) -> None:
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for (method, path), model in BODIES.items():
        operation = doc["paths"].get(path, {}).get(method)
        if operation is None:
            continue
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }


def _add_examples(doc: dict[str, Any]) -> None:
    for (method, path), example in ADMIN_EXAMPLES.items():
        operation = doc["paths"].get(path, {}).get(method)
        if operation is None:
            continue
        if "request" in example:
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                media["example"] = example["request"]
        if "response" in example:
            for status, answer in operation.get("responses", {}).items():
                if status.startswith("2") and "content" in answer:
                    answer["content"]["application/json"]["example"] = example["response"]


def build_openapi(app: FastAPI, settings: TenancySettings) -> dict[str, Any]:
    doc = get_openapi(
        title="loragate gateway",
        version=app.version,
        openapi_version="3.1.0",
        description=DESCRIPTION,
        routes=app.routes,
    )
    doc.setdefault("components", {})["securitySchemes"] = _schemes(settings)
    for path, operations in doc["paths"].items():
        security = _security(path, settings)
        for operation in operations.values():
            # The Authorization header is the security scheme, not a parameter to fill in.
            params = [
                p for p in operation.get("parameters", []) if p.get("name") != "authorization"
            ]
            if params:
                operation["parameters"] = params
            else:
                operation.pop("parameters", None)
            if security is not None:
                operation["security"] = security
    _add_bodies(doc)
    _add_examples(doc)
    _add_docs_routes(app, doc)
    return doc


def _add_docs_routes(app: FastAPI, doc: dict[str, Any]) -> None:
    """The document lists every route the app serves, itself included."""
    if app.openapi_url:
        summary = "This document (OpenAPI 3.1)"
        doc["paths"][app.openapi_url] = {"get": {
            "tags": ["documentation"], "summary": summary, "operationId": "get_openapi_json",
            "responses": {"200": {"description": summary, "content": {"application/json": {}}}},
        }}  # fmt: skip


def install_openapi(app: FastAPI, settings: TenancySettings) -> None:
    """`app.openapi()` returns the document above (built once)."""
    cached: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not cached:
            cached.update(build_openapi(app, settings))
        return cached

    app.openapi = openapi  # type: ignore[method-assign]

"""Every route the gateway and the engine server serve is documented (docs/openai-api.md,
docs/tokens-api.md), and every route the docs name is served (see docs_reading.py)."""

from __future__ import annotations

import re
import secrets
import types
from pathlib import Path

import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from gateway.settings import GatewaySettings
from tests.docs.docs_reading import OPENAI_API, TOKENS_API, doc_files, inline_code, rel

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
ROUTE_MENTION = re.compile(r"`(" + "|".join(HTTP_METHODS) + r") (/[^`\s]*)`")
PATH_PARAM = re.compile(r"\{[^}]*\}")


def normalize_route(method: str, path: str) -> tuple[str, str]:
    """Path parameters compare by position only (`{model_id:path}` and `{id}` are `{}`)."""
    return method.upper(), PATH_PARAM.sub("{}", path.split("?", 1)[0])


def app_routes(app: FastAPI) -> set[tuple[str, str]]:
    """Every (method, path) the app serves: its OpenAPI schema (every included router, whatever
    FastAPI's internal route types) plus any plain route mounted on the app itself."""
    routes = {
        normalize_route(method, path)
        for path, operations in app.openapi().get("paths", {}).items()
        for method in operations
        if method.upper() in HTTP_METHODS
    }
    for route in app.routes:
        path, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if isinstance(path, str) and methods:
            routes |= {normalize_route(m, path) for m in methods if m in HTTP_METHODS}
    return routes


@pytest.fixture(scope="module")
def gateway_routes(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> set:
    from gateway.app import create_app

    tmp = tmp_path_factory.mktemp("docs-gateway")
    settings = GatewaySettings(
        model=tiny_model_dir,
        key_pepper=SecretStr(secrets.token_urlsafe(32)),
        salt_secret=SecretStr(secrets.token_urlsafe(32)),
        database_url=f"sqlite+aiosqlite:///{tmp / 'docs.db'}",
        adapter_store_dir=tmp / "adapters",
    )
    return app_routes(create_app(settings))  # the lifespan never runs: nothing is loaded


@pytest.fixture(scope="module")
def engine_routes() -> set:
    """The engine server's app, built around a stand-in engine (no model is loaded); if its
    factory ever needs more, the routes of every APIRouter in engine/server.py."""
    from fastapi import APIRouter

    import engine.server as server

    stand_in = types.SimpleNamespace(
        model_name="docs", stats=lambda: None, config=None, startup_choices=()
    )
    try:
        app = server.create_app(stand_in)  # type: ignore[arg-type]
    except (TypeError, AttributeError):
        app = FastAPI()
        for router in vars(server).values():
            if isinstance(router, APIRouter):
                app.include_router(router)
    return app_routes(app)


def route_mentions(path: Path) -> list[tuple[int, tuple[str, str], str]]:
    return [
        (number, normalize_route(*m.groups()), f"{m.group(1)} {m.group(2)}")
        for number, code in inline_code(path)
        for m in [ROUTE_MENTION.fullmatch(f"`{code}`")]
        if m is not None
    ]


def _undocumented(routes: set[tuple[str, str]], doc: Path, what: str) -> None:
    named = {route for _, route, _ in route_mentions(doc)}
    missing = sorted(routes - named)
    listing = "\n".join(f"  `{method} {path}`" for method, path in missing)
    assert not missing, f"{what} routes missing from {rel(doc)}:\n{listing}"


def test_every_gateway_route_is_documented(gateway_routes: set) -> None:
    _undocumented(gateway_routes, OPENAI_API, "gateway")


def test_every_engine_route_is_documented(engine_routes: set) -> None:
    _undocumented(engine_routes, TOKENS_API, "engine server")


def test_every_route_the_docs_name_exists(gateway_routes: set, engine_routes: set) -> None:
    """docs/openai-api.md names gateway routes, docs/tokens-api.md engine routes, and every
    other page either."""
    serving = {OPENAI_API: gateway_routes, TOKENS_API: engine_routes}
    unknown = []
    for path in doc_files():
        routes = serving.get(path, gateway_routes | engine_routes)
        for number, route, written in route_mentions(path):
            if route not in routes:
                unknown.append(f"  {rel(path)}:{number}: `{written}`")
    assert not unknown, "routes named in the docs that are not served:\n" + "\n".join(unknown)

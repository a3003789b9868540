"""Acceptance 4 (OIDC): tokens signed by a JWKS served from a local HTTP server."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from admin_harness import Harness, admin_harness
from joserfc import jwt
from joserfc.jwk import RSAKey
from tenancy_factories import SecretRegistry

from tenancy.settings import TenancySettings

ISSUER = "https://issuer.loragate.test"
AUDIENCE = "loragate-admin-api"
SIGNING = RSAKey.generate_key(2048, parameters={"kid": "k1"})
IMPOSTOR = RSAKey.generate_key(2048, parameters={"kid": "k1"})  # same kid, different key


@pytest.fixture(scope="module")
def jwks_url() -> Iterator[str]:
    body = json.dumps({"keys": [SIGNING.as_dict(private=False)]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/jwks.json" else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    server.shutdown()


@pytest.fixture
async def h(
    make_settings: Callable[..., TenancySettings],
    jwks_url: str,
    secret_registry: SecretRegistry,
) -> AsyncIterator[Harness]:
    settings = make_settings(oidc_issuer=ISSUER, oidc_audience=AUDIENCE, oidc_jwks_url=jwks_url)
    async with admin_harness(settings) as harness:
        secret_registry.add(harness.admin_key)
        yield harness


def claims(**over: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {
        "iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 300,
        "roles": ["loragate-admin"],
    }  # fmt: skip
    base.update(over)
    return base


def token(key: RSAKey = SIGNING, alg: str = "RS256", **over: Any) -> str:
    return jwt.encode({"alg": alg, "kid": "k1"}, claims(**over), key)


def unsigned_token() -> str:
    def b64(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims())}."


async def test_valid_admin_token_is_accepted(h: Harness) -> None:
    r = await h.call("GET", "/tenants", token())
    assert r.status_code == 200, r.text
    r = await h.call("POST", "/tenants", token(), json={"name": "from-oidc"})
    assert r.status_code == 201
    events = (await h.call("GET", "/audit?action=tenant.create")).json()
    assert any(e["actor"] == f"oidc:{ISSUER}#alice" for e in events)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: token(aud="someone-else"), id="wrong-audience"),
        pytest.param(lambda: token(iss="https://evil.test"), id="wrong-issuer"),
        pytest.param(lambda: token(exp=int(time.time()) - 3600), id="expired"),
        pytest.param(unsigned_token, id="alg-none"),
        pytest.param(lambda: token(key=IMPOSTOR), id="wrong-key"),
        pytest.param(lambda: token()[:-4] + "AAAA", id="tampered"),
        pytest.param(lambda: token(sub=None), id="no-subject"),
    ],
)
async def test_bad_tokens_are_401(h: Harness, bad: Callable[[], str]) -> None:
    r = await h.call("GET", "/tenants", bad())
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"


async def test_role_claim_maps_to_scope(h: Harness) -> None:
    tenant = (await h.call("POST", "/tenants", json={"name": "t-oidc"})).json()
    ta = token(roles=["loragate-tenant-admin"], loragate_tenant=tenant["id"])
    listed = (await h.call("GET", "/tenants", ta)).json()
    assert [t["id"] for t in listed] == [tenant["id"]]
    assert (await h.call("POST", "/tenants", ta, json={"name": "nope"})).status_code == 403
    assert (await h.call("GET", "/tenants", token(roles=["viewer"]))).status_code == 403

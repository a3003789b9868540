"""A small OpenID Connect provider on loopback, for the dashboard's SSO tests: discovery,
authorize (signs the user in at once, as the test chose), token (checks the code, the client and
the PKCE verifier) and JWKS endpoints. The test sets the claims of the next login, and can make
the provider answer with a wrong audience or a tampered signature."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from joserfc import jwt
from joserfc.jwk import RSAKey


@dataclass
class Grant:
    client_id: str
    redirect_uri: str
    nonce: str | None
    challenge: str
    claims: dict[str, Any]


@dataclass
class LocalIdp:
    client_id: str
    port: int = 0
    key: RSAKey = field(
        default_factory=lambda: RSAKey.generate_key(2048, parameters={"kid": "idp-1"})
    )
    next_claims: dict[str, Any] = field(default_factory=dict)
    mode: str = "good"  # "good", "wrong-audience", "tampered"
    grants: dict[str, Grant] = field(default_factory=dict)
    num_token_requests: int = 0
    pkce_checked: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": self.issuer + "/authorize",
            "token_endpoint": self.issuer + "/token",
            "jwks_uri": self.issuer + "/jwks.json",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
        }

    def id_token(self, grant: Grant) -> str:
        now = int(time.time())
        claims = {
            "iss": self.issuer, "sub": "sso-user", "iat": now, "exp": now + 300,
            "aud": "someone-else" if self.mode == "wrong-audience" else grant.client_id,
            **({"nonce": grant.nonce} if grant.nonce else {}), **grant.claims,
        }  # fmt: skip
        token = jwt.encode({"alg": "RS256", "kid": "idp-1"}, claims, self.key)
        if self.mode == "tampered":  # change the payload, keep the signature
            head, payload, sig = token.split(".")
            body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            body["roles"] = ["loragate-admin"]
            raw = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
            token = f"{head}.{raw}.{sig}"
        return token

    def start(self) -> LocalIdp:
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path == "/.well-known/openid-configuration":
                    return self._json(200, idp.metadata())
                if url.path == "/jwks.json":
                    return self._json(200, {"keys": [idp.key.as_dict(private=False)]})
                if url.path != "/authorize":
                    return self._json(404, {"error": "not_found"})
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                if q.get("client_id") != idp.client_id or q.get("code_challenge_method") != "S256":
                    return self._json(400, {"error": "invalid_request"})
                code = secrets.token_urlsafe(16)
                idp.grants[code] = Grant(
                    client_id=q["client_id"], redirect_uri=q["redirect_uri"],
                    nonce=q.get("nonce"), challenge=q["code_challenge"],
                    claims=dict(idp.next_claims),
                )  # fmt: skip
                target = q["redirect_uri"] + "?" + urlencode({"code": code, "state": q["state"]})
                self.send_response(302)
                self.send_header("location", target)
                self.end_headers()

            def do_POST(self) -> None:
                if urlsplit(self.path).path != "/token":
                    return self._json(404, {"error": "not_found"})
                length = int(self.headers.get("content-length", "0"))
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                idp.num_token_requests += 1
                grant = idp.grants.pop(form.get("code", ""), None)
                if grant is None or form.get("client_id") != grant.client_id:
                    return self._json(400, {"error": "invalid_grant"})
                if form.get("redirect_uri") != grant.redirect_uri:
                    return self._json(400, {"error": "invalid_grant"})
                verifier = form.get("code_verifier", "")
                digest = hashlib.sha256(verifier.encode()).digest()
                if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant.challenge:
                    return self._json(400, {"error": "invalid_grant"})
                idp.pkce_checked += 1
                self._json(200, {
                    "access_token": secrets.token_urlsafe(16), "token_type": "Bearer",
                    "expires_in": 300, "id_token": idp.id_token(grant),
                })  # fmt: skip

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()

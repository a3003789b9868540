"""The dashboard's session: a signed, expiring cookie, and the CSRF token that goes with it.

The cookie (`lg_session`) holds who logged in, never a secret: for a key login the key's id
(each page re-checks that the key still holds, so revoking it ends the session), for SSO the
principal the ID token's roles mapped to. It is signed with itsdangerous (HMAC-SHA256 under the
session secret) and carries its own expiry; it is HttpOnly, SameSite=Strict, and Secure when the
page is served over TLS. Logout ends it on the server too: its random id is recorded in the
database, which every replica checks (`tenancy/dashboard_logouts.py`), so a copy of the cookie
is refused after logout. Each session has a random CSRF token, which every form that changes
state must send back (`csrf_token`); the login form, before any session, uses a short-lived
signed cookie of its own (`lg_login`), the double-submit pattern.

The session secret is `dashboard_session_secret`, or else an HMAC of `key_pepper` under a fixed
label: the pepper is already a strong secret every replica shares, and the label keeps the two
uses apart (a session signature never equals a key digest).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer

from gateway.api_docs.openapi import SESSION_COOKIE
from gateway.settings import GatewaySettings
from tenancy.auth.principal import Principal
from tenancy.auth.scopes import Scope

LOGIN_COOKIE = "lg_login"
LOGIN_TTL_S = 600  # a login form (or an SSO round trip) must be finished within this
PATH = "/dashboard"
_DERIVE_LABEL = b"loragate dashboard session v1"


@dataclass(frozen=True)
class DashboardSession:
    subject: str  # "key:<id>" or "oidc:<issuer>#<sub>"; never a secret
    tenant_id: str | None
    scopes: tuple[str, ...]
    key_id: str | None  # set for key logins: re-checked on every page
    csrf: str
    expires_at: float  # unix seconds
    # Random, not secret (the signature, not the id, makes a cookie valid): what logout records
    # so that every replica refuses a copy of the cookie afterwards (tenancy/dashboard_logouts.py).
    session_id: str

    def principal(self) -> Principal:
        return Principal(
            subject=self.subject,
            tenant_id=self.tenant_id,  # type: ignore[arg-type]
            scopes=frozenset(Scope(s) for s in self.scopes),
        )


def session_secret(settings: GatewaySettings) -> bytes:
    if settings.dashboard_session_secret is not None:
        return settings.dashboard_session_secret.get_secret_value().encode()
    pepper = settings.key_pepper.get_secret_value().encode()
    return hmac.new(pepper, _DERIVE_LABEL, hashlib.sha256).digest()


class SessionCodec:
    def __init__(self, settings: GatewaySettings, clock: Callable[[], float] = time.time) -> None:
        secret = session_secret(settings)
        self._sessions = URLSafeTimedSerializer(secret, salt="lg-session")
        self._logins = URLSafeTimedSerializer(secret, salt="lg-login")
        self._ttl_s = settings.dashboard_session_ttl_s
        self._clock = clock

    # ---- the session ---------------------------------------------------------------------------

    def new(self, principal: Principal) -> DashboardSession:
        return DashboardSession(
            subject=principal.subject,
            tenant_id=principal.tenant_id,
            scopes=tuple(sorted(principal.scopes)),
            key_id=principal.key_id,
            csrf=secrets.token_urlsafe(32),
            expires_at=self._clock() + self._ttl_s,
            session_id=secrets.token_urlsafe(24),
        )

    def read(self, request: Request) -> DashboardSession | None:
        """The request's session if its signature holds and it has not expired; else None."""
        raw = request.cookies.get(SESSION_COOKIE)
        if not raw:
            return None
        try:
            data: dict[str, Any] = self._sessions.loads(raw, max_age=int(self._ttl_s) + 1)
            session = DashboardSession(
                subject=str(data["subject"]),
                tenant_id=data["tenant_id"],
                scopes=tuple(data["scopes"]),
                key_id=data["key_id"],
                csrf=str(data["csrf"]),
                expires_at=float(data["expires_at"]),
                session_id=str(data["session_id"]),  # a cookie from before ids: log in again
            )
        except (BadSignature, KeyError, TypeError, ValueError):
            return None
        return session if self._clock() < session.expires_at else None

    def write(self, response: Response, request: Request, session: DashboardSession) -> None:
        response.set_cookie(
            SESSION_COOKIE,
            self._sessions.dumps(asdict(session)),
            max_age=int(session.expires_at - self._clock()),
            path=PATH,
            secure=is_tls(request),
            httponly=True,
            samesite="strict",
        )

    @staticmethod
    def has_cookie(request: Request) -> bool:
        return bool(request.cookies.get(SESSION_COOKIE))

    @staticmethod
    def clear(response: Response) -> None:
        response.delete_cookie(SESSION_COOKIE, path=PATH, httponly=True, samesite="strict")

    # ---- before a session: the login form's CSRF token and the SSO round trip's state ----------

    def login_state(self, request: Request) -> dict[str, Any]:
        raw = request.cookies.get(LOGIN_COOKIE)
        if not raw:
            return {}
        try:
            data = self._logins.loads(raw, max_age=LOGIN_TTL_S)
        except BadSignature:
            return {}
        return data if isinstance(data, dict) else {}

    def write_login_state(self, response: Response, request: Request, data: dict[str, Any]) -> None:
        # SameSite=Lax, not Strict: the identity provider's redirect back is a cross-site
        # navigation that must carry it. It holds no session, only this round trip's state.
        response.set_cookie(
            LOGIN_COOKIE,
            self._logins.dumps(data),
            max_age=LOGIN_TTL_S,
            path=PATH,
            secure=is_tls(request),
            httponly=True,
            samesite="lax",
        )


def is_tls(request: Request) -> bool:
    """https as the server sees it (X-Forwarded-Proto only from trusted proxies)."""
    return request.url.scheme == "https"


def csrf_ok(expected: str | None, sent: str | None) -> bool:
    return bool(expected) and bool(sent) and hmac.compare_digest(str(expected), str(sent))

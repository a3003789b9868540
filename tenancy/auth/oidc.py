"""OIDC bearer tokens for the admin API: issuer, audience, expiry and signature (issuer's JWKS).

Verification uses joserfc, the JOSE library behind authlib (authlib.jose is deprecated in favour
of it). Only asymmetric algorithms from settings are accepted, so `alg: none` and HS256 tokens
signed with a public key are refused. A role claim maps to a scope.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from tenancy.auth.principal import Principal
from tenancy.auth.scopes import Scope
from tenancy.errors import IdentityProviderUnavailable, InvalidApiKey
from tenancy.ids import TenantId

_MIN_REFRESH_S = 10.0  # an unknown `kid` triggers at most one JWKS fetch per this interval


@dataclass(frozen=True)
class OidcConfig:
    issuer: str
    audience: str
    jwks_url: str
    algorithms: tuple[str, ...]
    role_claim: str
    admin_role: str
    tenant_admin_role: str
    tenant_claim: str
    jwks_ttl_s: float
    leeway_s: int = 30


class OidcVerifier:
    def __init__(
        self,
        config: OidcConfig,
        http: httpx.AsyncClient,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._http = http
        self._clock = clock
        self._keys: KeySet | None = None
        self._fetched_at = 0.0

    async def _keyset(self, *, force: bool = False) -> KeySet:
        now = self._clock()
        stale = now - self._fetched_at > self._config.jwks_ttl_s
        may_refresh = now - self._fetched_at > _MIN_REFRESH_S
        if self._keys is None or stale or (force and may_refresh):
            try:
                response = await self._http.get(self._config.jwks_url, timeout=5.0)
                response.raise_for_status()
                self._keys = KeySet.import_key_set(response.json())
            except (httpx.HTTPError, ValueError, JoseError) as exc:
                if self._keys is None:
                    raise IdentityProviderUnavailable() from exc
            self._fetched_at = now
        assert self._keys is not None
        return self._keys

    def _decode(self, token: str, keys: KeySet) -> dict[str, Any]:
        decoded = jwt.decode(token, keys, algorithms=list(self._config.algorithms))
        claims: dict[str, Any] = dict(decoded.claims)
        registry = jwt.JWTClaimsRegistry(
            now=int(self._clock()),
            leeway=self._config.leeway_s,
            iss={"essential": True, "value": self._config.issuer},
            aud={"essential": True, "value": self._config.audience},
            exp={"essential": True},
            sub={"essential": True},
        )
        registry.validate(claims)
        return claims

    async def verify(self, token: str) -> Principal:
        try:
            try:
                claims = self._decode(token, await self._keyset())
            except JoseError as exc:
                if "key" not in type(exc).__name__.lower() and "kid" not in str(exc).lower():
                    raise
                claims = self._decode(token, await self._keyset(force=True))
        except (JoseError, ValueError, TypeError) as exc:
            raise InvalidApiKey() from exc
        return self._principal(claims)

    def _principal(self, claims: dict[str, Any]) -> Principal:
        cfg = self._config
        roles = claims.get(cfg.role_claim) or []
        roles = [roles] if isinstance(roles, str) else list(roles)
        subject = f"oidc:{claims['iss']}#{claims['sub']}"
        if cfg.admin_role in roles:
            return Principal(subject=subject, tenant_id=None, scopes=frozenset({Scope.ADMIN}))
        tenant = claims.get(cfg.tenant_claim)
        if cfg.tenant_admin_role in roles and isinstance(tenant, str) and tenant:
            return Principal(
                subject=subject, tenant_id=TenantId(tenant), scopes=frozenset({Scope.TENANT_ADMIN})
            )
        return Principal(subject=subject, tenant_id=None, scopes=frozenset())

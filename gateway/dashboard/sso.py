""" "Sign in with SSO": the OIDC authorization code flow with PKCE, through authlib's Starlette
OAuth client, against `oidc_issuer` (its discovery document names the endpoints).

The ID token is checked twice: by authlib (signature from the provider's JWKS, issuer, audience =
our client id, expiry, the nonce of this round trip) and then by the admin API's own verifier
(`tenancy/auth/oidc.py`, with the configured algorithms and the client id as audience), whose role
mapping makes the principal. So the dashboard and the admin API read roles from the same claims
with the same code: `oidc_admin_role` is an admin, `oidc_tenant_admin_role` with a tenant in
`oidc_tenant_claim` a tenant-admin of that tenant, anything else may not open the dashboard.

authlib keeps the round trip's state (state, nonce, PKCE verifier) in `request.session`; here
that is the signed, short-lived login cookie (session.py), not a server-wide session middleware.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
from authlib.integrations.base_client import OAuthError
from authlib.integrations.starlette_client import OAuth, StarletteOAuth2App
from fastapi import Request, Response
from joserfc.errors import JoseError

from gateway.dashboard.session import SessionCodec
from gateway.settings import GatewaySettings
from tenancy.auth.oidc import OidcConfig, OidcVerifier
from tenancy.auth.principal import Principal
from tenancy.errors import ClientError


class SsoRefused(Exception):
    """The identity provider's answer did not check out; the login page says so, no detail."""


class Sso:
    def __init__(self, settings: GatewaySettings, codec: SessionCodec) -> None:
        if not (settings.oidc_issuer and settings.oidc_client_id and settings.oidc_jwks_url):
            raise ValueError("SSO needs oidc_issuer, oidc_client_id and oidc_jwks_url")
        self._codec = codec
        secret = settings.oidc_client_secret
        oauth = OAuth()
        self._client: StarletteOAuth2App = oauth.register(
            "loragate",
            client_id=settings.oidc_client_id,
            client_secret=secret.get_secret_value() if secret else None,
            server_metadata_url=settings.oidc_issuer.rstrip("/")
            + "/.well-known/openid-configuration",
            client_kwargs={
                "scope": "openid",
                "code_challenge_method": "S256",
                "token_endpoint_auth_method": "client_secret_basic" if secret else "none",
            },
        )
        self._http = httpx.AsyncClient()
        self._verifier = OidcVerifier(
            OidcConfig(
                issuer=settings.oidc_issuer,
                audience=settings.oidc_client_id,  # an ID token is addressed to its client
                jwks_url=settings.oidc_jwks_url,
                algorithms=tuple(settings.oidc_algorithms),
                role_claim=settings.oidc_role_claim,
                admin_role=settings.oidc_admin_role,
                tenant_admin_role=settings.oidc_tenant_admin_role,
                tenant_claim=settings.oidc_tenant_claim,
                jwks_ttl_s=settings.oidc_jwks_ttl_s,
            ),
            self._http,
        )

    def _attach(self, request: Request) -> dict[str, Any]:
        flow = dict(self._codec.login_state(request).get("sso", {}))
        request.scope["session"] = flow
        return flow

    async def start(self, request: Request, redirect_uri: str) -> Response:
        """Redirect to the provider's authorization endpoint; remember this round trip."""
        flow = self._attach(request)
        try:
            response = await self._client.authorize_redirect(request, redirect_uri)
        except (OAuthError, httpx.HTTPError, ValueError) as exc:
            raise SsoRefused() from exc
        state = self._codec.login_state(request)
        self._codec.write_login_state(response, request, {**state, "sso": flow})
        return response

    async def finish(self, request: Request) -> Principal:
        """The principal from the provider's answer, or SsoRefused."""
        self._attach(request)
        try:
            token = await self._client.authorize_access_token(request)
            id_token = token.get("id_token")
            if not isinstance(id_token, str):
                raise SsoRefused()
            principal = await self._verifier.verify(id_token)
        except (OAuthError, JoseError, httpx.HTTPError, ValueError, KeyError, ClientError) as exc:
            raise SsoRefused() from exc
        # An SSO principal has no key; its session lasts its own TTL (no key to re-check).
        return dataclasses.replace(principal, key_id=None)

    async def close(self) -> None:
        await self._http.aclose()

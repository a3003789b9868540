"""Admin authentication: `Authorization: Bearer <key or OIDC token>` -> Principal.

Runs as a dependency on each route (never a path test in a middleware). Every failure is the same
401; a store outage is a 503.
"""

from __future__ import annotations

from tenancy.auth.key_verify import KeyVerifier
from tenancy.auth.oidc import OidcVerifier
from tenancy.auth.principal import Principal
from tenancy.errors import InvalidApiKey
from tenancy.ids import ApiKeyId

_MAX_HEADER = 8192


def bearer_token(authorization: str | None) -> str:
    if not authorization or len(authorization) > _MAX_HEADER:
        raise InvalidApiKey()
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise InvalidApiKey()
    return token


async def authenticate(
    authorization: str | None,
    *,
    keys: KeyVerifier,
    key_prefix: str,
    oidc: OidcVerifier | None,
) -> Principal:
    token = bearer_token(authorization)
    if token.startswith(key_prefix + "_") or oidc is None or token.count(".") != 2:
        record = await keys.verify(token)
        return Principal(
            subject=f"key:{record.key_id}",
            tenant_id=record.tenant_id,
            scopes=record.scopes,
            key_id=ApiKeyId(record.key_id),
        )
    return await oidc.verify(token)

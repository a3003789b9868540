"""Authorization checks for the admin API. Visibility first (404), then scope (403).

A tenant-admin that names another tenant gets the same 404 as for a tenant that does not exist,
so it learns nothing about other tenants.
"""

from __future__ import annotations

from tenancy.auth.principal import Principal
from tenancy.auth.scopes import Scope, grantable_by
from tenancy.errors import InsufficientScope, NotFound


def require_tenant_visible(principal: Principal, tenant_id: str) -> None:
    if not principal.can_see_tenant(tenant_id):
        raise NotFound("Tenant")


def require_admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise InsufficientScope("This operation needs the admin scope.")


def require_any_admin(principal: Principal) -> None:
    if not (principal.is_admin or Scope.TENANT_ADMIN in principal.scopes):
        raise InsufficientScope("This operation needs the admin or tenant-admin scope.")


def require_grantable(principal: Principal, scopes: frozenset[Scope]) -> None:
    wider = scopes - grantable_by(principal.scopes)
    if wider:
        names = ", ".join(sorted(wider))
        raise InsufficientScope(f"A key cannot grant scopes wider than its own: {names}.")

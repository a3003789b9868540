"""Who is calling the admin API, and the request facts that go into audit events."""

from __future__ import annotations

from dataclasses import dataclass

from tenancy.auth.scopes import Scope
from tenancy.ids import ApiKeyId, TenantId


@dataclass(frozen=True)
class Principal:
    subject: str  # "key:<id>" or "oidc:<issuer>#<sub>"; never a secret
    tenant_id: TenantId | None  # None for an OIDC admin that belongs to no tenant
    scopes: frozenset[Scope]
    key_id: ApiKeyId | None = None

    @property
    def is_admin(self) -> bool:
        return Scope.ADMIN in self.scopes

    def can_see_tenant(self, tenant_id: str) -> bool:
        return self.is_admin or (Scope.TENANT_ADMIN in self.scopes and self.tenant_id == tenant_id)


@dataclass(frozen=True)
class AuditContext:
    principal: Principal
    request_id: str | None = None
    client_addr: str | None = None

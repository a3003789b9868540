"""Key scopes and who may grant what. A key can never create a key wider than its own."""

from __future__ import annotations

from enum import StrEnum


class Scope(StrEnum):
    INFERENCE = "inference"
    TENANT_ADMIN = "tenant-admin"
    ADMIN = "admin"


# Scopes a holder of each scope may put on a key it creates (within its own tenant, for
# tenant-admin; anywhere, for admin).
GRANTABLE: dict[Scope, frozenset[Scope]] = {
    Scope.ADMIN: frozenset(Scope),
    Scope.TENANT_ADMIN: frozenset({Scope.INFERENCE, Scope.TENANT_ADMIN}),
    Scope.INFERENCE: frozenset(),
}


def grantable_by(scopes: frozenset[Scope]) -> frozenset[Scope]:
    result: frozenset[Scope] = frozenset()
    for scope in scopes:
        result |= GRANTABLE[scope]
    return result

"""TENANT on the command line: a tenant's id or its name (names are unique, ids are UUIDs).

A UUID is taken as an id as it is, with no call. Anything else is looked up by name in
`GET /tenants`, the list the caller's key may see: an admin sees every tenant, a tenant admin
only its own, so a tenant admin resolves its own name and no other (and learns nothing about
the names of others: "none you can see" either way).
"""

from __future__ import annotations

import uuid

from tenancy.admin_cli.client import AdminClient


class TenantNotFound(Exception):
    pass


def is_tenant_id(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text.lower()
    except ValueError:
        return False


def resolve_tenant(client: AdminClient, ref: str) -> str:
    """The tenant id `ref` names; TenantNotFound, naming the TENANT argument, when none does."""
    if is_tenant_id(ref):
        return ref
    for tenant in client.call("GET", "/tenants"):
        if tenant["name"] == ref:
            return str(tenant["id"])
    raise TenantNotFound(
        f"TENANT {ref!r}: no tenant of that name among those this key can see (a tenant "
        "admin's key sees only its own tenant); `loragate admin tenants list` lists them"
    )

"""`loragate admin adapters versions|aliases|alias|switch|canary|canary-clear|delete-alias`: the
versions of an adapter name and the alias requests resolve it through, for a tenant's adapters
(TENANT) or the public ones (--public), through the admin REST API. A rollback is a switch."""

from __future__ import annotations

import argparse

from tenancy.admin_cli import render
from tenancy.admin_cli.client import AdminClient

ALIAS = [("name", "alias"), ("owner_tenant_id", "owner"), ("version", "version"),
         ("canary_version", "canary"), ("canary_weight", "canary %"),
         ("updated_at", "updated")]  # fmt: skip
VERSION = [("version", "version"), ("id", "id"), ("name", "name"), ("owner_tenant_id", "owner"),
           ("sha256", "sha256"), ("created_at", "uploaded")]  # fmt: skip


class CommandMisuse(ValueError):
    """A command line the server would refuse anyway: shown like a usage error (exit 2)."""


def _owner(a: argparse.Namespace) -> str:
    """The path prefix of the owner's aliases: TENANT's, or the public ones."""
    if (a.tenant is None) == (not a.public):
        raise CommandMisuse("name the owner: TENANT, or --public")
    return "/adapter-aliases" if a.public else f"/tenants/{a.tenant}/adapter-aliases"


def _show(a: argparse.Namespace, data: object, columns: list[tuple[str, str]]) -> None:
    if a.json:
        render.as_json(data)
    elif isinstance(data, list):
        render.table(data, columns)
    elif isinstance(data, dict):
        render.record(data, columns)


def adapters_versions(c: AdminClient, a: argparse.Namespace) -> None:
    _owner(a)
    path = "/adapters" if a.public else f"/tenants/{a.tenant}/adapters"
    rows = c.call("GET", path, params={"name": a.name})
    if not a.public:  # the tenant's own versions (a tenant's name hides the public one's)
        owned = [r for r in rows if r["owner_tenant_id"] is not None]
        rows = owned or rows
    _show(a, rows, VERSION)


def adapters_aliases(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", _owner(a)), ALIAS)


def adapters_alias(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", f"{_owner(a)}/{a.name}"), ALIAS)


def adapters_switch(c: AdminClient, a: argparse.Namespace) -> None:
    alias = c.call("PUT", f"{_owner(a)}/{a.name}", json={"version": a.version})
    _show(a, alias, ALIAS)
    if not a.json:
        render.note(f"alias {a.name!r} now serves version {a.version}")


def adapters_canary(c: AdminClient, a: argparse.Namespace) -> None:
    body = {"version": a.version, "weight": a.weight}
    _show(a, c.call("PUT", f"{_owner(a)}/{a.name}/canary", json=body), ALIAS)


def adapters_canary_clear(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("DELETE", f"{_owner(a)}/{a.name}/canary"), ALIAS)


def adapters_delete_alias(c: AdminClient, a: argparse.Namespace) -> None:
    path = _owner(a)
    if a.with_versions and not a.yes:
        raise CommandMisuse("--with-versions deletes every version of the name: add --yes")
    params = {"with_versions": "true"} if a.with_versions else None
    c.call("DELETE", f"{path}/{a.name}", params=params)
    gone = " and every version of it" if a.with_versions else ""
    render.note(f"deleted alias {a.name!r}{gone}")

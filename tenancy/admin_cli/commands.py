"""`loragate admin tenants|keys|quotas|adapters|usage|webhooks|audit|login ...`: the admin REST API from a
shell, the way kubectl talks to its server (never to the database). Each command is one or two
API calls; tables for people, `--json` for scripts (the API's answer as it is)."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from typing import Any

from tenancy.admin_cli import profile, render
from tenancy.admin_cli.aliases import (
    CommandMisuse,
    adapters_alias,
    adapters_aliases,
    adapters_canary,
    adapters_canary_clear,
    adapters_delete_alias,
    adapters_switch,
    adapters_versions,
)
from tenancy.admin_cli.client import AdminApiError, AdminClient, ConnectionFailed
from tenancy.admin_cli.preflight import UploadLimits, check_upload
from tenancy.admin_cli.spend import prices_list, prices_set, spend
from tenancy.admin_cli.tenant_arg import TenantNotFound, resolve_tenant
from tenancy.admin_cli.upload import ARCHIVES, files_of, upload
from tenancy.admin_cli.webhooks import (
    webhooks_create,
    webhooks_delete,
    webhooks_deliveries,
    webhooks_get,
    webhooks_rotate_secret,
    webhooks_test,
    webhooks_update,
)

Handler = Callable[[AdminClient, argparse.Namespace], Any]

TENANT = [("id", "id"), ("name", "name"), ("tier", "tier"), ("status", "status"),
          ("created_at", "created")]  # fmt: skip
KEY = [("id", "id"), ("name", "name"), ("prefix", "prefix"), ("last_four", "last 4"),
       ("scopes", "scopes"), ("expires_at", "expires"), ("revoked_at", "revoked"),
       ("rotation_grace_until", "grace until")]  # fmt: skip
LIMITS = [("requests_per_minute", "requests/min"), ("tokens_per_minute", "tokens/min"),
          ("max_concurrent", "concurrent"), ("daily_token_budget", "tokens/day"),
          ("monthly_token_budget", "tokens/month"),
          ("daily_spend_budget_micros", "spend/day (micro)"),
          ("monthly_spend_budget_micros", "spend/month (micro)")]  # fmt: skip
POLICY = [("api_key_id", "key"), ("model", "model"), *LIMITS]
STATE = [("name", "limit"), ("limit", "max"), ("used", "used"), ("remaining", "remaining"),
         ("resets_in_s", "resets in (s)")]  # fmt: skip
ADAPTER = [("id", "id"), ("name", "name"), ("version", "version"), ("owner_tenant_id", "owner"),
           ("status", "status"),
           ("rank", "rank"), ("size_bytes", "bytes"), ("created_at", "uploaded")]  # fmt: skip
UPLOAD_LIMITS = [("max_rank", "max rank"), ("max_upload_bytes", "max bytes"),
                 ("max_files", "max files"), ("max_safetensors_header_bytes", "max header bytes"),
                 ("max_name_length", "max name length"), ("base_model", "base model"),
                 ("target_modules", "target modules")]  # fmt: skip
USAGE = [("day", "day"), ("model", "model"), ("num_requests", "requests"),
         ("prompt_tokens", "prompt"), ("completion_tokens", "completion"),
         ("cached_tokens", "cached")]  # fmt: skip
AUDIT = [("created_at", "when"), ("action", "action"), ("tenant_id", "tenant"),
         ("object_type", "object"), ("object_id", "object id"), ("actor_name", "actor")]  # fmt: skip


def _show(args: argparse.Namespace, data: Any, columns: list[tuple[str, str]]) -> None:
    if args.json:
        render.as_json(data)
    elif isinstance(data, list):
        render.table(data, columns)
    elif data is not None:
        render.record(data, columns)


# ---- tenants -------------------------------------------------------------------------------------


def tenants_list(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", "/tenants"), TENANT)


def tenants_get(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", f"/tenants/{a.tenant}"), TENANT)


def tenants_create(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("POST", "/tenants", json={"name": a.name, "tier": a.tier}), TENANT)


def tenants_update(c: AdminClient, a: argparse.Namespace) -> None:
    body = {k: v for k, v in (("name", a.name), ("tier", a.tier), ("status", a.status)) if v}
    _show(a, c.call("PATCH", f"/tenants/{a.tenant}", json=body), TENANT)


def tenants_delete(c: AdminClient, a: argparse.Namespace) -> None:
    if not a.yes:
        raise UsageError("deleting a tenant removes its keys, quotas and adapters: add --yes")
    c.call("DELETE", f"/tenants/{a.tenant}")
    render.note(f"deleted tenant {a.tenant}")


def tenants_rotate_salt(c: AdminClient, a: argparse.Namespace) -> None:
    _show(
        a,
        c.call("POST", f"/tenants/{a.tenant}/salt/rotate"),
        [*TENANT, ("salt_epoch", "salt epoch")],
    )


# ---- keys ----------------------------------------------------------------------------------------


def _created_key(a: argparse.Namespace, data: dict[str, Any]) -> None:
    if a.json:
        render.as_json(data)
        return
    render.note("API key (shown once; store it now):")
    sys.stdout.write(data["key"] + "\n")  # stdout carries it alone, for `key=$(...)`
    render.record(data, KEY, stderr=True)


def keys_list(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", f"/tenants/{a.tenant}/keys"), KEY)


def keys_create(c: AdminClient, a: argparse.Namespace) -> None:
    body = {"name": a.name, "scopes": a.scope or ["inference"], "expires_at": a.expires_at}
    _created_key(a, c.call("POST", f"/tenants/{a.tenant}/keys", json=body))


def keys_rotate(c: AdminClient, a: argparse.Namespace) -> None:
    body = {"grace_seconds": a.grace_seconds}
    _created_key(a, c.call("POST", f"/tenants/{a.tenant}/keys/{a.key_id}/rotate", json=body))


def keys_revoke(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("POST", f"/tenants/{a.tenant}/keys/{a.key_id}/revoke"), KEY)


# ---- quotas --------------------------------------------------------------------------------------


def _quota_path(a: argparse.Namespace, what: str) -> str:
    key = f"/keys/{a.key}" if a.key else ""
    return f"/tenants/{a.tenant}{key}/{what}"


def _model(a: argparse.Namespace) -> dict[str, str | None]:
    """`?model=NAME`: one base model's policy; absent, the all-models one."""
    return {"model": a.model}


def quotas_get(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", _quota_path(a, "quotas"), params=_model(a)), POLICY)


def quotas_list(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", f"/tenants/{a.tenant}/quota-policies"), POLICY)


def quotas_set(c: AdminClient, a: argparse.Namespace) -> None:
    """The limits given change; the others keep their values (read first: an edit another
    admin makes in between is overwritten for the fields read), or with --replace become
    unlimited."""
    given = {field: getattr(a, field) for field, _ in LIMITS if hasattr(a, field)}
    if a.replace:
        body = {field: given.get(field) for field, _ in LIMITS}
    else:
        current = c.call("GET", _quota_path(a, "quotas"), params=_model(a))
        body = {field: current.get(field) for field, _ in LIMITS} | given
    _show(a, c.call("PUT", _quota_path(a, "quotas"), json=body, params=_model(a)), POLICY)


def quotas_state(c: AdminClient, a: argparse.Namespace) -> None:
    state = c.call("GET", _quota_path(a, "quota-state"))
    if a.json:
        render.as_json(state)
        return
    render.table(state["limits"], STATE, title=f"{state['subject']} as of {state['as_of']}")
    rejections = state["rejections_last_hour"]
    render.table([{"reason": r, "count": n} for r, n in sorted(rejections.items())],
                 [("reason", "rejected (last hour)"), ("count", "count")])  # fmt: skip


# ---- adapters, usage, audit ----------------------------------------------------------------------


def adapters_list(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", f"/tenants/{a.tenant}/adapters"), ADAPTER)


def adapters_get(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", f"/tenants/{a.tenant}/adapters/{a.adapter}"), [*ADAPTER,
          ("base_model", "base model"), ("target_modules", "targets"), ("sha256", "sha256")])  # fmt: skip


def adapters_limits(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", "/adapters/limits"), UPLOAD_LIMITS)


def _upload_limits(c: AdminClient) -> UploadLimits | None:
    try:
        return UploadLimits.from_api(c.call("GET", "/adapters/limits"))
    except AdminApiError as exc:
        if exc.status == 404:  # a gateway older than the endpoint: the server checks alone
            return None
        raise


def adapters_upload(c: AdminClient, a: argparse.Namespace) -> None:
    if (a.tenant is None) == (not a.public):
        raise UsageError("name the owner: TENANT, or --public (admins only)")
    if a.source.is_file() and not a.source.name.endswith(ARCHIVES):
        raise UsageError(f"{a.source}: a PEFT directory, or one of {', '.join(ARCHIVES)}")
    path = "/adapters" if a.public else f"/tenants/{a.tenant}/adapters"
    try:
        limits = _upload_limits(c)
        if limits is not None:
            limits = limits.for_base_model(a.base_model)  # the server checks its shapes
            check_upload(a.source, files_of(a.source), name=a.name, limits=limits)
        created = upload(
            c, path, name=a.name, source=a.source, quiet=a.json, activate=not a.no_activate,
            base_model=a.base_model,
        )  # fmt: skip
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _show(a, created, ADAPTER)


def adapters_delete(c: AdminClient, a: argparse.Namespace) -> None:
    c.call("DELETE", f"/tenants/{a.tenant}/adapters/{a.adapter}")
    render.note(f"deleted adapter {a.adapter}")


def usage(c: AdminClient, a: argparse.Namespace) -> None:
    params = {"since": a.since, "until": a.until}
    _show(a, c.call("GET", f"/tenants/{a.tenant}/usage", params=params), USAGE)


def audit(c: AdminClient, a: argparse.Namespace) -> None:
    params = {"tenant_id": a.tenant, "action": a.action, "actor": a.actor, "since": a.since,
              "until": a.until, "limit": a.limit}  # fmt: skip
    _show(a, c.call("GET", "/audit", params=params), AUDIT)


# ---- login (a profile), and running a command ----------------------------------------------------


class UsageError(Exception):
    pass


# handlers named by parser.py, kept elsewhere
__all__ = [
    "adapters_alias",
    "adapters_aliases",
    "adapters_canary",
    "adapters_canary_clear",
    "adapters_delete_alias",
    "adapters_switch",
    "adapters_versions",
    "prices_list",
    "prices_set",
    "spend",
    "webhooks_create",
    "webhooks_delete",
    "webhooks_deliveries",
    "webhooks_get",
    "webhooks_rotate_secret",
    "webhooks_test",
    "webhooks_update",
]


def tenant_of(args: argparse.Namespace) -> str | None:
    """TENANT, positional or by its earlier spelling `--tenant` (parser._tenant); given both
    ways with different values, a usage error rather than a silent pick."""
    flag = getattr(args, "tenant_flag", None)
    if flag is not None and args.tenant is not None and flag != args.tenant:
        raise UsageError(f"TENANT given twice ({args.tenant!r} and --tenant {flag!r})")
    return args.tenant if args.tenant is not None else flag


def login(a: argparse.Namespace) -> int:
    if sys.stdin.isatty():
        key = getpass.getpass("Admin API key: ")
    else:
        key = sys.stdin.readline()
    key = key.strip()
    if not key:
        print("loragate admin login: no key given on stdin", file=sys.stderr)
        return 2
    with AdminClient(a.url, key) as client:
        try:
            client.call("GET", "/tenants")  # the key works here before it is saved
        except (AdminApiError, ConnectionFailed) as exc:
            print(f"loragate admin login: {exc}", file=sys.stderr)
            return 1
    path = profile.save(a.profile or profile.DEFAULT_PROFILE, a.url, key)
    render.note(f"saved profile {a.profile or profile.DEFAULT_PROFILE!r} in {path} (mode 0600)")
    return 0


def run(handler: Handler, args: argparse.Namespace) -> int:
    try:
        target = profile.resolve(args.profile)
    except profile.ProfileError as exc:
        print(f"loragate admin: {exc}", file=sys.stderr)
        return 2
    try:
        if hasattr(args, "tenant"):
            args.tenant = tenant_of(args)
        with AdminClient(target.url, target.key) as client:
            if getattr(args, "tenant", None):
                args.tenant = resolve_tenant(client, args.tenant)
            handler(client, args)
    except (UsageError, CommandMisuse) as exc:
        print(f"loragate admin: {exc}", file=sys.stderr)
        return 2
    except (AdminApiError, ConnectionFailed, TenantNotFound) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0

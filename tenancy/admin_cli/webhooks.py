"""`loragate admin webhooks get|create|update|delete|rotate-secret|test|deliveries TENANT`: a
tenant's budget-alert webhook through the admin REST API. `create` and `rotate-secret` print the
signing secret once, alone on stdout (`secret=$(...)`), the rest on stderr."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tenancy.admin_cli import render
from tenancy.admin_cli.client import AdminClient

WEBHOOK = [("id", "id"), ("url", "url"), ("thresholds", "thresholds %"), ("events", "events"),
           ("enabled", "enabled"), ("updated_at", "updated")]  # fmt: skip
DELIVERY = [("created_at", "when"), ("event_type", "event"), ("status", "status"),
            ("num_attempts", "attempts"), ("last_status_code", "last HTTP"), ("id", "id")]  # fmt: skip


def _path(a: argparse.Namespace, suffix: str = "") -> str:
    return f"/tenants/{a.tenant}/webhook{suffix}"


def _with_secret(a: argparse.Namespace, data: dict[str, Any]) -> None:
    if a.json:
        render.as_json(data)
        return
    render.note("signing secret (shown once; store it now):")
    sys.stdout.write(data["secret"] + "\n")
    render.record(data, WEBHOOK, stderr=True)


def _show(a: argparse.Namespace, data: dict[str, Any]) -> None:
    if a.json:
        render.as_json(data)
    else:
        render.record(data, WEBHOOK)


def _fields(a: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if a.threshold:
        body["thresholds"] = a.threshold
    if a.event:
        body["events"] = a.event
    return body


def webhooks_get(c: AdminClient, a: argparse.Namespace) -> None:
    _show(a, c.call("GET", _path(a)))


def webhooks_create(c: AdminClient, a: argparse.Namespace) -> None:
    body = {"url": a.url, **_fields(a)}
    if a.disabled:
        body["enabled"] = False
    _with_secret(a, c.call("POST", _path(a), json=body))


def webhooks_update(c: AdminClient, a: argparse.Namespace) -> None:
    body = _fields(a)
    if a.url is not None:
        body["url"] = a.url
    if a.enabled is not None:
        body["enabled"] = a.enabled
    _show(a, c.call("PATCH", _path(a), json=body))


def webhooks_delete(c: AdminClient, a: argparse.Namespace) -> None:
    c.call("DELETE", _path(a))
    render.note("webhook deleted")


def webhooks_rotate_secret(c: AdminClient, a: argparse.Namespace) -> None:
    _with_secret(a, c.call("POST", _path(a, "/rotate-secret")))


def webhooks_test(c: AdminClient, a: argparse.Namespace) -> None:
    sent = c.call("POST", _path(a, "/test"))
    if a.json:
        render.as_json(sent)
    else:
        render.note(f"test event queued: {sent['delivery_id']} (see `webhooks deliveries`)")


def webhooks_deliveries(c: AdminClient, a: argparse.Namespace) -> None:
    rows = c.call("GET", _path(a, "/deliveries"), params={"limit": a.limit})
    if a.json:
        render.as_json(rows)
    else:
        render.table(rows, DELIVERY)

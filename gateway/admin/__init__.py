"""The admin REST API, mounted by the gateway app at /admin/v1.

The app factory stores a `tenancy.runtime.TenancyRuntime` on `app.state.tenancy`; errors are
answered by gateway/error_handlers.py, as everywhere.
"""

from __future__ import annotations

from fastapi import APIRouter

from gateway.admin import (
    adapters,
    aliases,
    audit,
    keys,
    quota_state,
    quotas,
    spend,
    tenants,
    usage,
    webhooks,
)

PREFIX = "/admin/v1"


def admin_router() -> APIRouter:
    router = APIRouter(prefix=PREFIX)
    modules = (
        tenants, keys, quotas, quota_state, adapters, aliases, usage, audit, webhooks, spend,
    )  # fmt: skip
    for module in modules:
        router.include_router(module.router)
    return router


__all__ = ["PREFIX", "admin_router"]

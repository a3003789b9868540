"""The dashboard's forms for tenants and keys: create and suspend (or reactivate) a tenant
(admin), create, rotate and revoke keys (admin, or a tenant-admin in its own tenant).

Each calls what the admin API's route calls, as the viewer's principal, inside the same audit
context; a refusal of the service (a 404 for another tenant, a 403 for a scope, a 400 naming a
field) is shown on the page it came from with the service's status. A new key (created or
rotated) is shown once, on the answer to the POST itself: never in a URL, a cookie or a log,
and the page is `no-store`.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from gateway.admin import keys as admin_keys
from gateway.admin import tenants as admin_tenants
from gateway.dashboard import views
from gateway.dashboard.auth import Viewer, ViewerDep
from gateway.dashboard.forms import ActorDep, done, duration_text, parse
from gateway.dashboard.routes import page
from gateway.dashboard.state import DashboardDep
from gateway.deps import StateDep
from tenancy.auth.scopes import Scope, grantable_by
from tenancy.crud import keys as crud_keys
from tenancy.crud import tenants as crud_tenants
from tenancy.crud.tenants import load_tenant
from tenancy.errors import BadRequest, ClientError
from tenancy.schemas import ApiKeyCreate, ApiKeyCreated, TenantCreate, TenantUpdate

router = APIRouter(prefix="/dashboard", tags=["dashboard"])

Text = Annotated[str, Form(max_length=256)]


async def _keys_page(
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    viewer: Viewer,
    tenant_id: str,
    *,
    error: str = "",
    status: int = 200,
    created: ApiKeyCreated | None = None,
) -> Response:
    now = state.tenancy.now()
    async with state.tenancy.sessionmaker() as session:
        try:
            tenant = await load_tenant(session, principal=viewer.principal, tenant_id=tenant_id)
            rows = await views.key_rows(session, viewer.principal, tenant_id, now)
        except ClientError:  # another tenant's keys: the 404 of a tenant that does not exist
            return page(dashboard, request, "error.html", 404, viewer=viewer,
                        message="No such tenant.")  # fmt: skip
    grace_s = state.tenancy.settings.default_rotation_grace_s
    return page(
        dashboard, request, "keys.html", status, viewer=viewer, tenant=tenant, keys=rows,
        error=error, created=created, grantable=sorted(grantable_by(viewer.principal.scopes)),
        grace=duration_text(grace_s), tab="keys",
    )  # fmt: skip


@router.post("/tenants")
async def create_tenant(
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    actor: ActorDep,
    name: Text,
    tier: Annotated[str, Form(max_length=64)] = "",
) -> Response:
    runtime = state.tenancy
    try:
        data = parse(TenantCreate, name=name.strip(), tier=tier or None)
        async with runtime.sessionmaker() as session:
            tenant = await crud_tenants.create_tenant(
                session, ctx=actor.ctx, data=data, tiers=runtime.tier_names,
                default_tier=runtime.settings.default_tier,
            )  # fmt: skip
    except ClientError as exc:
        rows = await views.overview(runtime, actor.viewer.principal, runtime.now())
        return page(
            dashboard, request, "overview.html", exc.status_code, viewer=actor.viewer, rows=rows,
            now=runtime.now(), create_error=exc.message, create_name=name,
        )  # fmt: skip
    return done(f"/dashboard/tenants/{tenant.id}", "tenant-created")


@router.post("/tenants/{tenant_id}/status")
async def set_tenant_status(
    tenant_id: str,
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    actor: ActorDep,
    status: Annotated[str, Form(max_length=16)],
) -> Response:
    try:
        data = parse(TenantUpdate, status=status)
        async with state.tenancy.sessionmaker() as session:
            await admin_tenants.update(
                session, ctx=actor.ctx, runtime=state.tenancy, tenant_id=tenant_id, data=data
            )
    except ClientError as exc:
        message = "No such tenant." if exc.status_code == 404 else exc.message
        return page(dashboard, request, "error.html", exc.status_code, viewer=actor.viewer,
                    message=message)  # fmt: skip
    return done(f"/dashboard/tenants/{tenant_id}", f"tenant-{status}")


@router.get("/tenants/{tenant_id}/keys")
async def keys_page(
    tenant_id: str, request: Request, dashboard: DashboardDep, state: StateDep, viewer: ViewerDep
) -> Response:
    return await _keys_page(request, dashboard, state, viewer, tenant_id)


def _expiry(expires_on: str) -> dt.datetime | None:
    if not expires_on:
        return None
    try:
        day = dt.date.fromisoformat(expires_on)
    except ValueError as exc:
        raise BadRequest("expires_on: a date, YYYY-MM-DD.", param="expires_on") from exc
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)


@router.post("/tenants/{tenant_id}/keys")
async def create_key(
    tenant_id: str,
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    actor: ActorDep,
    name: Text,
    scopes: Annotated[list[str] | None, Form(max_length=32)] = None,
    expires_on: Annotated[str, Form(max_length=32)] = "",
) -> Response:
    runtime = state.tenancy
    try:
        data = parse(
            ApiKeyCreate, name=name.strip(), scopes=scopes or [Scope.INFERENCE],
            expires_at=_expiry(expires_on.strip()),
        )  # fmt: skip
        async with runtime.sessionmaker() as session:
            created = await crud_keys.create_key(
                session, ctx=actor.ctx, minter=runtime.minter, tenant_id=tenant_id, data=data,
                now=runtime.now(),
            )  # fmt: skip
    except ClientError as exc:
        return await _keys_page(request, dashboard, state, actor.viewer, tenant_id,
                                error=exc.message, status=exc.status_code)  # fmt: skip
    return await _keys_page(request, dashboard, state, actor.viewer, tenant_id, created=created)


@router.post("/tenants/{tenant_id}/keys/{key_id}/rotate")
async def rotate_key(
    tenant_id: str,
    key_id: str,
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    actor: ActorDep,
) -> Response:
    try:
        async with state.tenancy.sessionmaker() as session:
            created = await admin_keys.rotate(
                session, ctx=actor.ctx, runtime=state.tenancy, tenant_id=tenant_id,
                key_id=key_id, grace_s=None,
            )  # fmt: skip
    except ClientError as exc:
        return await _keys_page(request, dashboard, state, actor.viewer, tenant_id,
                                error=exc.message, status=exc.status_code)  # fmt: skip
    return await _keys_page(request, dashboard, state, actor.viewer, tenant_id, created=created)


@router.post("/tenants/{tenant_id}/keys/{key_id}/revoke")
async def revoke_key(
    tenant_id: str,
    key_id: str,
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    actor: ActorDep,
) -> Response:
    try:
        async with state.tenancy.sessionmaker() as session:
            await admin_keys.revoke(
                session, ctx=actor.ctx, runtime=state.tenancy, tenant_id=tenant_id, key_id=key_id
            )
    except ClientError as exc:
        return await _keys_page(request, dashboard, state, actor.viewer, tenant_id,
                                error=exc.message, status=exc.status_code)  # fmt: skip
    return done(f"/dashboard/tenants/{tenant_id}/keys", "key-revoked")

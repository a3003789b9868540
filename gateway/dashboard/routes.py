"""The dashboard's routes under /dashboard: pages (server-rendered), login and logout, SSO, the
live quota state the tenant page polls, and its two static files.

Pages are answered with `cache-control: no-store` and a Content-Security-Policy that allows
nothing from elsewhere (no inline script, no inline style), so the page works offline and a
tenant's data never sits in a shared cache.
"""

from __future__ import annotations

import datetime as dt
import secrets
from types import MappingProxyType
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from gateway.dashboard import views
from gateway.dashboard.auth import ViewerDep, may_open_dashboard
from gateway.dashboard.session import csrf_ok
from gateway.dashboard.sso import SsoRefused
from gateway.dashboard.state import STATIC_DIR, Dashboard, DashboardDep
from gateway.deps import StateDep
from tenancy.auth.principal import Principal
from tenancy.dashboard_logouts import end_session
from tenancy.errors import InvalidApiKey, NotFound, TenantSuspended
from tenancy.quota.state import QuotaStateOut, quota_state

router = APIRouter(prefix="/dashboard", tags=["dashboard"])

HEADERS = MappingProxyType(
    {
        "cache-control": "no-store",
        "content-security-policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
        "script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        "x-frame-options": "DENY",
        "referrer-policy": "no-referrer",
        "x-content-type-options": "nosniff",
    }
)
STATIC_FILES = {
    "dashboard.css": "text/css",
    "dashboard.js": "text/javascript",
    "forms.css": "text/css",  # the forms of actions.py and its neighbours
    "actions.js": "text/javascript",  # copy a new key, confirm, the upload's progress
}
REFUSED = "That key was not accepted."
NOT_FOR_DASHBOARD = "This key cannot open the dashboard: it needs the admin or tenant-admin scope."
SSO_REFUSED = "Sign-in with SSO did not complete: the identity provider's answer was refused."
BAD_FORM = "This form expired or did not come from this dashboard. Reload the page and try again."
NOTICES = {"expired": "Your session expired. Log in again.", "ended": "Your session ended."}


def page(
    dashboard: Dashboard, request: Request, name: str, status_code: int = 200, **context: Any
) -> Response:
    return dashboard.templates.TemplateResponse(
        request, name, {**context, "sso": dashboard.sso is not None},
        status_code=status_code, headers=dict(HEADERS),
    )  # fmt: skip


def see_other(path: str) -> RedirectResponse:
    # A path only: a redirect is never built from the Host header.
    return RedirectResponse(path, status_code=303, headers={"cache-control": "no-store"})


def _login_form(
    dashboard: Dashboard, request: Request, *, error: str = "", notice: str = "", status: int = 200
) -> Response:
    token = secrets.token_urlsafe(32)
    response = page(
        dashboard, request, "login.html", status, csrf_token=token, error=error, notice=notice
    )
    dashboard.codec.write_login_state(response, request, {"csrf": token})
    return response


def _logged_in(dashboard: Dashboard, request: Request, principal: Principal) -> Response:
    session = dashboard.codec.new(principal)
    # A page, not a redirect: after an SSO round trip the browser would not send a
    # SameSite=Strict cookie along a redirect chain that began on the provider's site.
    response = page(dashboard, request, "signed_in.html")
    dashboard.codec.write(response, request, session)
    return response


@router.get("/login")
async def login_page(request: Request, dashboard: DashboardDep, reason: str = "") -> Response:
    return _login_form(dashboard, request, notice=NOTICES.get(reason, ""))


@router.post("/login")
async def login(
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    key: Annotated[str, Form(max_length=8192)],
    csrf_token: Annotated[str | None, Form(max_length=256)] = None,
) -> Response:
    expected = dashboard.codec.login_state(request).get("csrf")
    if not csrf_ok(expected, csrf_token):
        return _login_form(dashboard, request, error=BAD_FORM, status=403)
    try:
        record = await state.tenancy.keys.verify(key.strip())
    except (InvalidApiKey, TenantSuspended):
        return _login_form(dashboard, request, error=REFUSED, status=401)
    principal = Principal(
        subject=f"key:{record.key_id}", tenant_id=record.tenant_id, scopes=record.scopes,
        key_id=record.key_id,
    )  # fmt: skip
    if not may_open_dashboard(principal):
        return _login_form(dashboard, request, error=NOT_FOR_DASHBOARD, status=403)
    return _logged_in(dashboard, request, principal)


@router.post("/logout")
async def logout(
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    viewer: ViewerDep,
    csrf_token: Annotated[str | None, Form(max_length=256)] = None,
) -> Response:
    if not csrf_ok(viewer.session.csrf, csrf_token):
        return page(dashboard, request, "error.html", 403, viewer=viewer, message=BAD_FORM)
    expires_at = dt.datetime.fromtimestamp(viewer.session.expires_at, dt.UTC)
    async with state.tenancy.sessionmaker() as db:
        await end_session(
            db, session_id=viewer.session.session_id, expires_at=expires_at,
            now=state.tenancy.now(),
        )  # fmt: skip
    response = see_other("/dashboard/login")
    dashboard.codec.clear(response)
    return response


@router.get("/sso")
async def sso_start(request: Request, dashboard: DashboardDep) -> Response:
    if dashboard.sso is None or dashboard.settings.oidc_redirect_url is None:
        raise NotFound("Page")
    try:
        return await dashboard.sso.start(request, dashboard.settings.oidc_redirect_url)
    except SsoRefused:
        return _login_form(dashboard, request, error=SSO_REFUSED, status=502)


@router.get("/sso/callback")
async def sso_callback(request: Request, dashboard: DashboardDep) -> Response:
    if dashboard.sso is None:
        raise NotFound("Page")
    try:
        principal = await dashboard.sso.finish(request)
    except SsoRefused:
        return _login_form(dashboard, request, error=SSO_REFUSED, status=401)
    if not may_open_dashboard(principal):
        return _login_form(dashboard, request, error=SSO_REFUSED, status=403)
    return _logged_in(dashboard, request, principal)


@router.get("")
async def overview(
    request: Request, dashboard: DashboardDep, state: StateDep, viewer: ViewerDep
) -> Response:
    now = state.tenancy.now()
    rows = await views.overview(state.tenancy, viewer.principal, now)
    return page(dashboard, request, "overview.html", viewer=viewer, rows=rows, now=now)


@router.get("/tenants/{tenant_id}")
async def tenant(
    tenant_id: str, request: Request, dashboard: DashboardDep, state: StateDep, viewer: ViewerDep
) -> Response:
    now = state.tenancy.now()
    try:
        data = await views.tenant_page(state.tenancy, viewer.principal, tenant_id, now)
    except NotFound:  # another tenant's page is the same 404 as one that does not exist
        return page(dashboard, request, "error.html", 404, viewer=viewer,
                    message="No such tenant.")  # fmt: skip
    return page(dashboard, request, "tenant.html", viewer=viewer, data=data, now=now)


@router.get("/tenants/{tenant_id}/quota-state", response_model=QuotaStateOut)
async def live_quota_state(tenant_id: str, state: StateDep, viewer: ViewerDep) -> object:
    async with state.tenancy.sessionmaker() as session:
        return await quota_state(
            session, principal=viewer.principal, quotas=state.tenancy.quotas,
            rejections=state.tenancy.rejections, tenant_id=tenant_id, now=state.tenancy.now(),
        )  # fmt: skip


@router.get("/engines")
async def engines(
    request: Request, dashboard: DashboardDep, state: StateDep, viewer: ViewerDep
) -> Response:
    rows = await views.engines_page(state, viewer.principal)
    return page(dashboard, request, "engines.html", viewer=viewer, rows=rows)


@router.get("/static/{name}")
async def static(name: str) -> Response:
    media_type = STATIC_FILES.get(name)
    if media_type is None:  # only the listed files: no path from the request reaches the disk
        raise NotFound("File")
    return FileResponse(
        STATIC_DIR / name, media_type=media_type, headers={"cache-control": "max-age=300"}
    )

"""The quota dashboard at /dashboard: server-rendered pages over the same data the admin API
serves (routes.py), forms that act through the admin API's own functions (actions.py,
quota_form.py, uploads.py; forms.py checks their CSRF token), usage and audit reports
(reports.py), a signed session from an admin or tenant-admin key or from SSO (session.py,
auth.py, sso.py), server-made SVG charts (charts.py)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from gateway.dashboard import actions, quota_form, reports, uploads
from gateway.dashboard.auth import LoginRequired
from gateway.dashboard.forms import FLASHES, FormRefused, form_refused
from gateway.dashboard.routes import router, see_other
from gateway.dashboard.state import Dashboard
from gateway.settings import GatewaySettings


async def _login_required(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LoginRequired)
    response = see_other("/dashboard/login" + (f"?reason={exc.reason}" if exc.reason else ""))
    request.app.state.dashboard.codec.clear(response)
    return response


def install_dashboard(app: FastAPI, settings: GatewaySettings) -> Dashboard:
    """Mount the routes; the app's lifespan closes what `Dashboard` holds."""
    dashboard = Dashboard.build(settings)
    app.state.dashboard = dashboard
    app.include_router(router)
    for module in (actions, quota_form, uploads, reports):  # the forms and their pages
        app.include_router(module.router)
    app.add_exception_handler(LoginRequired, _login_required)
    app.add_exception_handler(FormRefused, form_refused)
    dashboard.templates.env.globals.update(
        FLASHES=FLASHES, TIERS=sorted(settings.tiers), DEFAULT_TIER=settings.default_tier
    )
    return dashboard


__all__ = ["install_dashboard"]

"""The quota dashboard at /dashboard: server-rendered pages over the same data the admin API
serves (routes.py), a signed session from an admin or tenant-admin key or from SSO (session.py,
auth.py, sso.py), server-made SVG charts (charts.py)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from gateway.dashboard.auth import LoginRequired
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
    app.add_exception_handler(LoginRequired, _login_required)
    return dashboard


__all__ = ["install_dashboard"]

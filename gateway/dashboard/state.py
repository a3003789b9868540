"""The dashboard's parts, built once by the app factory: the session codec, the templates, and
the SSO client when OIDC login is configured."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from fastapi.templating import Jinja2Templates

from gateway.dashboard.session import SessionCodec
from gateway.dashboard.sso import Sso
from gateway.settings import GatewaySettings

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"


@dataclass
class Dashboard:
    settings: GatewaySettings
    codec: SessionCodec
    templates: Jinja2Templates
    sso: Sso | None

    @classmethod
    def build(cls, settings: GatewaySettings) -> Dashboard:
        codec = SessionCodec(settings)
        templates = Jinja2Templates(directory=HERE / "templates")
        sso = Sso(settings, codec) if settings.oidc_client_id else None
        return cls(settings=settings, codec=codec, templates=templates, sso=sso)

    async def close(self) -> None:
        if self.sso is not None:
            await self.sso.close()


def get_dashboard(request: Request) -> Dashboard:
    dashboard: Dashboard = request.app.state.dashboard
    return dashboard


DashboardDep = Annotated[Dashboard, Depends(get_dashboard)]

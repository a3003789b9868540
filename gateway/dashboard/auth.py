"""Who is looking at the dashboard: the `Viewer` dependency of every page.

A page needs a session whose signature holds, which has not expired and was not logged out of
(on any replica: the logout is in the database); a session made with an
API key also needs that key to hold still (not revoked, expired or rotated past its grace, its
tenant active), checked on every page, so revoking the key ends the session everywhere. Without
one, the viewer is sent to the login page (`LoginRequired`, answered by a redirect).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from gateway.dashboard.session import DashboardSession
from gateway.dashboard.state import DashboardDep
from gateway.deps import StateDep
from tenancy.auth.principal import Principal
from tenancy.auth.scopes import Scope
from tenancy.dashboard_logouts import is_ended
from tenancy.dashboard_reads import key_principal

DASHBOARD_SCOPES = frozenset({Scope.ADMIN, Scope.TENANT_ADMIN})


class LoginRequired(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # "" (no session), "expired", "ended" (its key no longer holds)


@dataclass(frozen=True)
class Viewer:
    principal: Principal
    session: DashboardSession

    @property
    def is_admin(self) -> bool:
        return self.principal.is_admin


def may_open_dashboard(principal: Principal) -> bool:
    return bool(principal.scopes & DASHBOARD_SCOPES)


async def get_viewer(request: Request, dashboard: DashboardDep, state: StateDep) -> Viewer:
    session = dashboard.codec.read(request)
    if session is None:
        raise LoginRequired("expired" if dashboard.codec.has_cookie(request) else "")
    principal = session.principal()
    async with state.tenancy.sessionmaker() as db:
        if await is_ended(db, session_id=session.session_id):
            raise LoginRequired("")  # logged out: the login page, as after a logout here
        if session.key_id is not None:
            held = await key_principal(db, key_id=session.key_id, now=state.tenancy.now())
            if held is None:
                raise LoginRequired("ended")
            principal = held
    if not may_open_dashboard(principal):
        raise LoginRequired("ended")
    return Viewer(principal=principal, session=session)


ViewerDep = Annotated[Viewer, Depends(get_viewer)]

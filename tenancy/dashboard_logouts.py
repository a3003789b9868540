"""Dashboard logouts, kept in the database so that every gateway replica refuses the session.

A dashboard session is a signed cookie that any replica accepts on its own (`gateway/dashboard/
session.py`); clearing it in the browser at logout leaves a copy of it valid until it expires.
Logout therefore records the session's id here, and every page checks it. The database, not a
replica's memory, because the next request may reach another replica; not Redis, because the
embedded mode has none. A row lives only until its session would have expired anyway.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.sql.models import DashboardLogout


async def end_session(
    session: AsyncSession, *, session_id: str, expires_at: dt.datetime, now: dt.datetime
) -> None:
    await session.execute(delete(DashboardLogout).where(DashboardLogout.expires_at <= now))
    session.add(DashboardLogout(session_id=session_id, expires_at=expires_at))
    try:
        await session.commit()
    except IntegrityError:  # logged out twice at once (two tabs, two replicas): ended either way
        await session.rollback()


async def is_ended(session: AsyncSession, *, session_id: str) -> bool:
    return await session.get(DashboardLogout, session_id) is not None

"""Which tenants want which alerts: each tenant's webhook settings, cached for a few seconds.

The evaluator asks for every tenant whose budgets moved; the database is read at most once per
tenant per `ttl_s` (an admin change applies within it), and a tenant without a webhook costs a
dictionary lookup after its first miss.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tenancy.sql.models import AlertWebhook


@dataclass(frozen=True)
class Subscription:
    tenant_id: str
    thresholds: tuple[int, ...]
    events: frozenset[str]


def _subscription(row: AlertWebhook) -> Subscription | None:
    if not row.enabled:
        return None
    return Subscription(row.tenant_id, tuple(row.thresholds), frozenset(row.events))


class WebhookDirectory:
    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        *,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, Subscription | None]] = {}

    async def get(self, tenant_id: str) -> Subscription | None:
        now = self._clock()
        hit = self._cache.get(tenant_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        async with self._sessionmaker() as session:
            row = (
                await session.scalars(
                    select(AlertWebhook).where(AlertWebhook.tenant_id == tenant_id)
                )
            ).first()
        found = _subscription(row) if row is not None else None
        if len(self._cache) > 100_000:  # tenants come and go; drop the stale ones
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        self._cache[tenant_id] = (now + self._ttl_s, found)
        return found

    async def subscribed_to(self, event_type: str) -> list[Subscription]:
        """Every enabled webhook that takes `event_type` (outages concern every tenant)."""
        async with self._sessionmaker() as session:
            rows = await session.scalars(select(AlertWebhook).where(AlertWebhook.enabled))
            found = [_subscription(row) for row in rows.all()]
        return [s for s in found if s is not None and event_type in s.events]

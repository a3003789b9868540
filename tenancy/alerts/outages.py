"""Outage alerts: the quota store or the engine stopped answering.

`down(service)` and `up(service)` are synchronous and cheap (the request path calls them on every
failure and success); they only flip this replica's view. A task of its own acts on the flips:
when a service goes down it fires `outage.<service>` once for every tenant whose webhook
subscribes to it, through the same once-guard as budget alerts (period `open`: replicas that see
the same outage send one alert per tenant); when it is back, the guard rows are removed so the
next outage alerts again. A replica sends no second alert for a service within
`outage_min_interval_s` of its last, however often the service flaps.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tenancy.alerts import events, outbox
from tenancy.alerts.delivery import DeliveryWorker
from tenancy.alerts.directory import WebhookDirectory
from tenancy.ids import new_id
from tenancy.quota.subjects import tenant_subject
from tenancy.rounds import RoundLoop

log = logging.getLogger(__name__)

SERVICES = ("quota_store", "engine")


class OutageAlerts:
    def __init__(
        self,
        *,
        sessionmaker: async_sessionmaker[AsyncSession],
        directory: WebhookDirectory,
        worker: DeliveryWorker,
        min_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._directory = directory
        self._worker = worker
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._is_down: dict[str, bool] = dict.fromkeys(SERVICES, False)
        self._acted: dict[str, bool] = dict.fromkeys(SERVICES, False)  # what the task last did
        self._last_alert: dict[str, float] = {}
        self._rounds = RoundLoop(self.run_once, name="outage-alerts", on_failure=_round_failed)
        self.num_fired = 0

    def down(self, service: str) -> None:
        if not self._is_down[service]:
            self._is_down[service] = True
            self._rounds.wake()

    def up(self, service: str) -> None:
        if self._is_down[service]:
            self._is_down[service] = False
            self._rounds.wake()

    def start(self) -> None:
        self._rounds.start()

    async def run_once(self) -> int:
        fired = 0
        for service in SERVICES:
            is_down = self._is_down[service]
            if is_down == self._acted[service]:
                continue
            if is_down:
                fired += await self._fire(service)
            else:
                await outbox.release_outage(self._sessionmaker, f"outage.{service}")
            self._acted[service] = is_down
        if fired:
            self._worker.wake()
        return fired

    async def _fire(self, service: str) -> int:
        last = self._last_alert.get(service)
        if last is not None and self._clock() - last < self._min_interval_s:
            return 0
        self._last_alert[service] = self._clock()
        event_type = f"outage.{service}"
        now = dt.datetime.now(dt.UTC)
        fired = 0
        for subscription in await self._directory.subscribed_to(event_type):
            tenant_id = subscription.tenant_id
            event_id = new_id()
            firing = outbox.Firing(
                tenant_id, tenant_subject(tenant_id), event_type, outbox.OUTAGE_PERIOD, 0
            )
            body = events.outage_body(event_id, tenant_id=tenant_id, service=service, now=now)
            if await outbox.fire_once(
                self._sessionmaker, firing, delivery_id=event_id, event_type=event_type,
                body=body, now=now,
            ):  # fmt: skip
                fired += 1
        self.num_fired += fired
        return fired

    async def close(self) -> None:
        await self._rounds.close()


def _round_failed(exc: Exception) -> None:
    # The database is down too: try again at the next flip.
    log.warning("outage alert round failed (%s)", type(exc).__name__)

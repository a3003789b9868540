"""Budget thresholds: after a request settles, has any budget it charged crossed a threshold?

The bookkeeping calls `settled(tenant_id, subjects)` after each settlement, and `refused(...)`
when admission refused a request for a budget: synchronous and O(1) (it notes the subjects;
nothing is awaited on the request's task). A task of its own then
works through the noted subjects, coalesced (a tenant settling 500 requests while one round
runs is read once in the next), and for each subject that has a budget and whose tenant has an
enabled webhook subscribed to `budget.threshold`: reads the subject's usage from the quota store
(the numbers admission enforces, across replicas in Redis), turns it into `BudgetReading`s
(budgets.py: token budgets, and any other kind that has a reader) and, for every threshold
reached, fires the alert once (outbox.fire_once: the database's unique constraint decides
between replicas). A threshold this process has seen fired is remembered, so a budget past 80%
costs one store read per round and no database write.

Nothing is lost when a round fails (the store or the database is down): the next settlement of
the subject evaluates it again, and the guard keeps it to one alert.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tenancy.alerts import events, outbox
from tenancy.alerts.budgets import EXHAUSTED, READERS, BudgetReader, crossed, has_budget
from tenancy.alerts.delivery import DeliveryWorker
from tenancy.alerts.directory import WebhookDirectory
from tenancy.errors import ServiceUnavailable
from tenancy.ids import new_id
from tenancy.quota.store import QuotaStore, QuotaSubject, periods
from tenancy.rounds import RoundLoop

log = logging.getLogger(__name__)

MAX_REMEMBERED = 65536
FAILED_ROUND_PAUSE_S = 1.0


@dataclass
class _Noted:
    """A subject to evaluate, and the budgets that refused one of its requests meanwhile."""

    tenant_id: str
    subject: QuotaSubject
    refused: set[str]


class BudgetAlerts:
    def __init__(
        self,
        *,
        sessionmaker: async_sessionmaker[AsyncSession],
        quotas: QuotaStore,
        directory: WebhookDirectory,
        worker: DeliveryWorker,
        readers: Sequence[BudgetReader] = READERS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._quotas = quotas
        self._directory = directory
        self._worker = worker
        self._readers = readers
        self._clock = clock
        self._pending: dict[str, _Noted] = {}  # by subject key
        self._fired: OrderedDict[outbox.Firing, None] = OrderedDict()
        # A failed round pauses: the database or the store is down, and one warning a second
        # beats one a request (the next settlement of each subject evaluates it again).
        self._rounds = RoundLoop(
            self.run_once,
            name="budget-alerts",
            on_failure=_round_failed,
            pause_after_failure_s=FAILED_ROUND_PAUSE_S,
        )
        self.num_fired = 0

    def settled(self, tenant_id: str, subjects: Sequence[QuotaSubject]) -> None:
        for subject in subjects:
            if has_budget(subject.limits):
                self._note(tenant_id, subject)

    def refused(self, tenant_id: str, subject: QuotaSubject, budget: str) -> None:
        """Admission refused a request for `budget` (a policy field): it is exhausted."""
        self._note(tenant_id, subject).refused.add(budget)

    def _note(self, tenant_id: str, subject: QuotaSubject) -> _Noted:
        noted = self._pending.get(subject.key)
        if noted is None or noted.subject != subject:  # a policy change: the newest limits
            refused = noted.refused if noted is not None else set()
            noted = self._pending[subject.key] = _Noted(tenant_id, subject, refused)
        self._rounds.wake()
        return noted

    def start(self) -> None:
        self._rounds.start()

    async def run_once(self) -> int:
        """Evaluate every subject noted so far; returns the number of alerts fired."""
        batch, self._pending = self._pending, {}
        fired = 0
        for noted in batch.values():
            fired += await self._evaluate(noted)
        if fired:
            self._worker.wake()
        return fired

    async def _evaluate(self, noted: _Noted) -> int:
        tenant_id, subject = noted.tenant_id, noted.subject
        subscription = await self._directory.get(tenant_id)
        if subscription is None or events.BUDGET_THRESHOLD not in subscription.events:
            return 0
        try:
            usage = await self._quotas.usage(subject.key)
        except ServiceUnavailable:
            return 0  # the outage alert covers it; the next settlement reads again
        day, month, _, _ = periods(self._clock())
        fired = 0
        for reader in self._readers:
            for reading in reader(subject.key, subject.limits, usage, day, month):
                exhausted = reading.budget in noted.refused
                for threshold in crossed(reading, subscription.thresholds, exhausted=exhausted):
                    firing = outbox.Firing(
                        tenant_id, reading.subject, reading.budget, reading.period, threshold
                    )
                    if firing in self._fired:
                        continue
                    now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
                    event_id = new_id()
                    body = events.budget_body(
                        event_id, tenant_id=tenant_id, reading=reading, threshold=threshold,
                        exhausted=exhausted and threshold == EXHAUSTED, now=now,
                    )  # fmt: skip
                    if await outbox.fire_once(
                        self._sessionmaker, firing, delivery_id=event_id,
                        event_type=events.BUDGET_THRESHOLD, body=body, now=now,
                    ):  # fmt: skip
                        fired += 1
                        self.num_fired += 1
                    self._remember(firing)
        return fired

    def _remember(self, firing: outbox.Firing) -> None:
        self._fired[firing] = None
        if len(self._fired) > MAX_REMEMBERED:
            self._fired.popitem(last=False)

    async def close(self) -> None:
        await self._rounds.close()


def _round_failed(exc: Exception) -> None:
    log.warning("budget alert round failed (%s)", type(exc).__name__)

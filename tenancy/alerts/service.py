"""The alerting a gateway process runs: budget thresholds, outages and the webhook sender, built
from settings once (gateway/app.py) and closed at shutdown after the last settlement."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tenancy.alerts.delivery import DeliveryWorker
from tenancy.alerts.directory import WebhookDirectory
from tenancy.alerts.evaluator import BudgetAlerts
from tenancy.alerts.outages import OutageAlerts
from tenancy.alerts.secret_box import SecretBox
from tenancy.quota.store import QuotaStore, QuotaSubject
from tenancy.settings import TenancySettings


class AlertService:
    def __init__(
        self,
        settings: TenancySettings,
        sessionmaker: async_sessionmaker[AsyncSession],
        quotas: QuotaStore,
        *,
        cache_ttl_s: float,
    ) -> None:
        directory = WebhookDirectory(sessionmaker, ttl_s=cache_ttl_s)
        box = SecretBox(settings.key_pepper.get_secret_value().encode())
        self.worker = DeliveryWorker(sessionmaker, settings.alerts, box)
        self.budgets = BudgetAlerts(
            sessionmaker=sessionmaker, quotas=quotas, directory=directory, worker=self.worker
        )
        self.outages = OutageAlerts(
            sessionmaker=sessionmaker, directory=directory, worker=self.worker,
            min_interval_s=settings.alerts.outage_min_interval_s,
        )  # fmt: skip

    def settled(self, tenant_id: str, subjects: Sequence[QuotaSubject]) -> None:
        self.budgets.settled(tenant_id, subjects)

    def refused(self, tenant_id: str, subject: QuotaSubject, budget: str) -> None:
        self.budgets.refused(tenant_id, subject, budget)

    def down(self, service: str) -> None:
        self.outages.down(service)

    def up(self, service: str) -> None:
        self.outages.up(service)

    def start(self) -> None:
        self.worker.start()
        self.budgets.start()
        self.outages.start()

    async def close(self) -> None:
        # The evaluators first: what they fire at the end is still sent by the worker's last
        # round, if the receiver answers before shutdown ends (else another replica sends it).
        await self.budgets.close()
        await self.outages.close()
        await self.worker.close()

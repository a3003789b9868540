"""What the request path pays for budget alerts: `settled` is a dictionary write, and the
evaluation behind it is coalesced (500 settlements of one subject between two rounds are one
quota-store read), a tenant without a webhook costs no store read at all, a subject without a
budget is never noted, and a threshold fired once costs no database write afterwards."""

from __future__ import annotations

import secrets
import time

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tenancy.alerts.delivery import DeliveryWorker
from tenancy.alerts.directory import WebhookDirectory
from tenancy.alerts.evaluator import BudgetAlerts
from tenancy.alerts.secret_box import SecretBox
from tenancy.alerts.settings import AlertSettings
from tenancy.ids import RequestId, new_id
from tenancy.quota.memory_store import InProcessQuotaStore
from tenancy.quota.store import QuotaLimits, QuotaSubject, QuotaUsage
from tenancy.sql.models import AlertFiring, AlertWebhook, Tenant
from tenancy.sql.session import make_sessionmaker


class CountingStore(InProcessQuotaStore):
    def __init__(self) -> None:
        super().__init__(lease_ttl_s=60)
        self.num_reads = 0

    async def usage(self, subject_key: str) -> QuotaUsage:
        self.num_reads += 1
        return await super().usage(subject_key)


async def test_settling_is_cheap_and_evaluation_coalesced(migrated_engine: AsyncEngine) -> None:
    db = make_sessionmaker(migrated_engine)
    watched, quiet = new_id(), new_id()
    async with db() as session:
        for tid in (watched, quiet):
            session.add(Tenant(id=tid, name=f"t-{tid[:8]}", tier="standard"))
        await session.flush()
        session.add(AlertWebhook(id=new_id(), tenant_id=watched, url="http://127.0.0.1:9/",
                                 secret_sealed="x", thresholds=[50], events=["budget.threshold"],
                                 enabled=True))  # fmt: skip
        await session.commit()
    store = CountingStore()
    box = SecretBox(secrets.token_bytes(32))
    alerts = BudgetAlerts(
        sessionmaker=db, quotas=store, directory=WebhookDirectory(db, ttl_s=60),
        worker=(worker := DeliveryWorker(db, AlertSettings(), box)),
    )  # fmt: skip
    budget = QuotaLimits(daily_token_budget=1000)
    subjects = {t: [QuotaSubject(f"t:{t}", budget)] for t in (watched, quiet)}
    for t in (watched, quiet):
        admission = await store.admit(
            request_id=RequestId(new_id()), subjects=subjects[t], reserve_tokens=600
        )
        await store.settle(admission, used_tokens=600)  # 60%: past the 50% threshold
    started = time.perf_counter()
    for _ in range(500):
        alerts.settled(watched, subjects[watched])
        alerts.settled(quiet, subjects[quiet])
        alerts.settled(watched, [QuotaSubject("k:nobudget", QuotaLimits(requests_per_minute=9))])
    per_call_us = (time.perf_counter() - started) / 1500 * 1e6
    assert per_call_us < 200, per_call_us  # a dict write, not I/O (generous for slow machines)
    assert await alerts.run_once() == 1
    assert store.num_reads == 1  # one read for 500 settlements; none for the quiet tenant
    for _ in range(50):
        alerts.settled(watched, subjects[watched])
    assert await alerts.run_once() == 0  # fired already: remembered, no second insert
    assert store.num_reads == 2
    async with db() as session:
        assert await session.scalar(select(func.count()).select_from(AlertFiring)) == 1
    await alerts.close()
    await worker.close()

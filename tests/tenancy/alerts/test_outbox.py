"""The outbox in SQL, on SQLite and PostgreSQL (`_racing`, `_retention`, run on each):
concurrent replicas racing for one threshold enqueue exactly one delivery; a claimed delivery is not claimed twice; the log's retention
prunes finished deliveries (with their attempts) and ended once-guards, never pending ones."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tenancy.alerts import outbox
from tenancy.ids import new_id
from tenancy.sql.migrate import upgrade
from tenancy.sql.models import AlertDelivery, AlertDeliveryAttempt, AlertFiring, Tenant
from tenancy.sql.session import make_engine, make_sessionmaker

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


@asynccontextmanager
async def _migrated(url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = make_engine(url)
    await upgrade(engine)
    try:
        yield make_sessionmaker(engine)
    finally:
        await engine.dispose()


async def _tenant(db: async_sessionmaker[AsyncSession]) -> str:
    async with db() as session:
        tenant = Tenant(id=new_id(), name=f"t-{new_id()[:8]}", tier="standard")
        session.add(tenant)
        await session.commit()
        return tenant.id


async def _count(db: async_sessionmaker[AsyncSession], model: type) -> int:
    async with db() as session:
        return int((await session.scalar(select(func.count()).select_from(model))) or 0)


async def _racing(db: async_sessionmaker[AsyncSession]) -> None:
    tid = await _tenant(db)
    firing = outbox.Firing(tid, f"t:{tid}", "daily_token_budget", "2026-11-29", 80)

    async def replica() -> bool:
        event_id = new_id()
        return await outbox.fire_once(
            db, firing, delivery_id=event_id, event_type="budget.threshold",
            body=f'{{"id":"{event_id}"}}', now=NOW,
        )  # fmt: skip

    won = await asyncio.gather(*(replica() for _ in range(8)))
    assert sorted(won) == [False] * 7 + [True]
    assert await _count(db, AlertDelivery) == 1 and await _count(db, AlertFiring) == 1
    other = outbox.Firing(tid, f"t:{tid}", "daily_token_budget", "2026-11-30", 80)  # next day
    assert await outbox.fire_once(db, other, delivery_id=new_id(), event_type="budget.threshold",
                                  body="{}", now=NOW)  # fmt: skip

    [first, _] = await outbox.due(db, now=NOW, limit=10)
    until = NOW + dt.timedelta(seconds=60)
    claims = await asyncio.gather(
        *(outbox.claim(db, first, now=NOW, until=until) for _ in range(4))
    )
    assert sum(c is not None for c in claims) == 1  # one worker sends the attempt
    assert first not in await outbox.due(db, now=NOW, limit=10)  # held while claimed
    later = until + dt.timedelta(seconds=1)
    assert first in await outbox.due(db, now=later, limit=10)  # a lapsed claim is taken over


async def _retention(db: async_sessionmaker[AsyncSession]) -> None:
    tid = await _tenant(db)
    old = NOW - dt.timedelta(days=45)
    for period, when in (("2026-10-15", old), ("2026-11-29", NOW), (outbox.OUTAGE_PERIOD, old)):
        firing = outbox.Firing(tid, f"t:{tid}", "daily_token_budget", period, 50)
        assert await outbox.fire_once(db, firing, delivery_id=new_id(),
                                      event_type="budget.threshold", body="{}", now=when)  # fmt: skip
    claimed = []
    for delivery_id in await outbox.due(db, now=NOW, limit=10):
        claim = await outbox.claim(db, delivery_id, now=NOW, until=NOW)
        assert claim is not None
        claimed.append(claim)
    ok = outbox.Outcome(NOW, NOW, 200, None)
    await outbox.record(db, claimed[0], ok, next_attempt_at=None)  # delivered
    await outbox.record(db, claimed[1], outbox.Outcome(NOW, NOW, 500, "HTTP 500"),
                        next_attempt_at=None)  # failed for good  # fmt: skip
    # claimed[2], the newest (due last), stays pending
    await outbox.prune(db, now=NOW, keep=dt.timedelta(days=30))
    async with db() as session:
        left = {d.id: d.status for d in (await session.scalars(select(AlertDelivery))).all()}
        guards = sorted((await session.scalars(select(AlertFiring.period))).all())
    assert left == {claimed[2].id: "pending"}  # the two old finished ones are gone
    assert guards == ["2026-11-29", outbox.OUTAGE_PERIOD]  # the old day's guard is gone
    assert await _count(db, AlertDeliveryAttempt) == 0  # attempts went with their deliveries


Check = Callable[[async_sessionmaker[AsyncSession]], Awaitable[None]]
CHECKS = [_racing, _retention]


@pytest.mark.parametrize("check", CHECKS)
async def test_outbox_on_sqlite(sqlite_url: str, check: Check) -> None:
    async with _migrated(sqlite_url) as db:
        await check(db)


@pytest.mark.postgres
@pytest.mark.parametrize("check", CHECKS)
async def test_outbox_on_postgres(postgres_url: str, check: Check) -> None:
    async with _migrated(postgres_url) as db:
        await check(db)

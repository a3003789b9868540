"""The alert outbox in SQL: the once-guard, the deliveries waiting to be sent, and their log.

`fire_once` writes the once-guard row and the delivery in one transaction: a replica that loses
the race on the guard's unique constraint writes nothing, so an alert is enqueued exactly once
however many replicas cross the threshold. A delivery then belongs to no replica: any worker may
`claim` it when it is due (a conditional UPDATE, so two workers never send the same attempt),
and `record` logs the attempt and either finishes it or schedules the next one.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import delete, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tenancy.ids import new_id
from tenancy.sql.models import (
    AlertDelivery,
    AlertDeliveryAttempt,
    AlertFiring,
    AlertWebhook,
)

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
OUTAGE_PERIOD = "open"


@dataclass(frozen=True)
class Firing:
    """One once-guard key: (subject, budget, period, threshold)."""

    tenant_id: str
    subject: str
    budget: str
    period: str
    threshold: int


async def enqueue(
    session: AsyncSession, *, delivery_id: str, tenant_id: str, event_type: str, body: str,
    now: dt.datetime,
) -> None:  # fmt: skip
    session.add(
        AlertDelivery(
            id=delivery_id,
            tenant_id=tenant_id,
            event_type=event_type,
            body=body,
            status=PENDING,
            num_attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
    )


async def fire_once(
    sessionmaker: async_sessionmaker[AsyncSession],
    firing: Firing,
    *,
    delivery_id: str,
    event_type: str,
    body: str,
    now: dt.datetime,
) -> bool:
    """True when this call claimed the guard and enqueued the delivery; False when the alert
    was fired before (by this replica or another)."""
    async with sessionmaker() as session:
        session.add(
            AlertFiring(
                id=new_id(),
                tenant_id=firing.tenant_id,
                subject=firing.subject,
                budget=firing.budget,
                period=firing.period,
                threshold=firing.threshold,
                created_at=now,
            )
        )
        await enqueue(
            session, delivery_id=delivery_id, tenant_id=firing.tenant_id,
            event_type=event_type, body=body, now=now,
        )  # fmt: skip
        try:
            await session.commit()
        except IntegrityError:
            await session.rollback()
            return False
    return True


async def release_outage(sessionmaker: async_sessionmaker[AsyncSession], budget: str) -> None:
    """The service is back: the next outage of it alerts again."""
    async with sessionmaker() as session:
        await session.execute(
            delete(AlertFiring).where(
                AlertFiring.budget == budget, AlertFiring.period == OUTAGE_PERIOD
            )
        )
        await session.commit()


@dataclass(frozen=True)
class Claimed:
    id: str
    tenant_id: str
    event_type: str
    body: str
    attempt: int  # the number of the attempt about to be made (1-based)
    webhook: AlertWebhook | None


async def due(
    sessionmaker: async_sessionmaker[AsyncSession], *, now: dt.datetime, limit: int
) -> list[str]:
    async with sessionmaker() as session:
        rows = await session.scalars(
            select(AlertDelivery.id)
            .where(AlertDelivery.status == PENDING, AlertDelivery.next_attempt_at <= now)
            .where(or_(AlertDelivery.claimed_until.is_(None), AlertDelivery.claimed_until < now))
            .order_by(AlertDelivery.next_attempt_at)
            .limit(limit)
        )
        return list(rows.all())


async def claim(
    sessionmaker: async_sessionmaker[AsyncSession],
    delivery_id: str,
    *,
    now: dt.datetime,
    until: dt.datetime,
) -> Claimed | None:
    """Take the delivery for one attempt, or None when another worker has it (or it is done)."""
    async with sessionmaker() as session:
        result = await session.execute(
            update(AlertDelivery)
            .where(AlertDelivery.id == delivery_id, AlertDelivery.status == PENDING)
            .where(AlertDelivery.next_attempt_at <= now)
            .where(or_(AlertDelivery.claimed_until.is_(None), AlertDelivery.claimed_until < now))
            .values(claimed_until=until)
        )
        if getattr(result, "rowcount", 0) != 1:
            await session.rollback()
            return None
        await session.commit()
        delivery = await session.get(AlertDelivery, delivery_id)
        if delivery is None:  # its tenant was deleted meanwhile
            return None
        webhook = (
            await session.scalars(
                select(AlertWebhook).where(AlertWebhook.tenant_id == delivery.tenant_id)
            )
        ).first()
        return Claimed(
            id=delivery.id, tenant_id=delivery.tenant_id, event_type=delivery.event_type,
            body=delivery.body, attempt=delivery.num_attempts + 1, webhook=webhook,
        )  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    started_at: dt.datetime
    finished_at: dt.datetime
    status_code: int | None
    error: str | None

    @property
    def is_ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


async def record(
    sessionmaker: async_sessionmaker[AsyncSession],
    claimed: Claimed,
    outcome: Outcome,
    *,
    next_attempt_at: dt.datetime | None,
) -> None:
    """Log the attempt; the delivery is done when it succeeded, failed for good when
    `next_attempt_at` is None, else pending again from then."""
    status = DELIVERED if outcome.is_ok else (PENDING if next_attempt_at else FAILED)
    async with sessionmaker() as session:
        session.add(
            AlertDeliveryAttempt(
                id=new_id(),
                delivery_id=claimed.id,
                attempt=claimed.attempt,
                started_at=outcome.started_at,
                finished_at=outcome.finished_at,
                status_code=outcome.status_code,
                error=outcome.error,
            )
        )
        await session.execute(
            update(AlertDelivery)
            .where(AlertDelivery.id == claimed.id)
            .values(
                status=status,
                num_attempts=claimed.attempt,
                claimed_until=None,
                last_status_code=outcome.status_code,
                next_attempt_at=next_attempt_at or outcome.finished_at,
                delivered_at=outcome.finished_at if outcome.is_ok else None,
            )
        )
        try:
            await session.commit()
        except IntegrityError:  # another worker logged this attempt (our claim had lapsed)
            await session.rollback()


# A firing's period (a UTC day or month) has surely ended this long after the firing.
FIRING_KEEP = dt.timedelta(days=40)


async def prune(
    sessionmaker: async_sessionmaker[AsyncSession], *, now: dt.datetime, keep: dt.timedelta
) -> None:
    """Forget finished deliveries (and their attempts, by cascade) older than `keep`, and
    budget once-guards whose period is over; pending deliveries and open outages stay."""
    async with sessionmaker() as session:
        await session.execute(
            delete(AlertDelivery).where(
                AlertDelivery.status != PENDING, AlertDelivery.created_at < now - keep
            )
        )
        await session.execute(
            delete(AlertFiring).where(
                AlertFiring.period != OUTAGE_PERIOD, AlertFiring.created_at < now - FIRING_KEEP
            )
        )
        await session.commit()

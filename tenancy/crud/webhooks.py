"""A tenant's budget-alert webhook: create (the signing secret returned once), read, update,
delete, rotate the secret, send a test event, and read the delivery log. An admin manages any
tenant's, a tenant admin its own tenant's; every change is in the audit log (the sealed secret
never is)."""

from __future__ import annotations

import datetime as dt
import json

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.alerts import events, outbox
from tenancy.alerts.schemas import (
    DeliveryAttemptOut,
    DeliveryOut,
    WebhookCreate,
    WebhookCreated,
    WebhookOut,
    WebhookUpdate,
)
from tenancy.alerts.secret_box import SecretBox, new_secret
from tenancy.alerts.targets import check_webhook_url
from tenancy.auditing.write import record_event, snapshot
from tenancy.auth.principal import AuditContext, Principal
from tenancy.crud.tenants import load_tenant
from tenancy.errors import Conflict, NotFound
from tenancy.ids import new_id
from tenancy.sql.models import AlertDelivery, AlertDeliveryAttempt, AlertWebhook, utcnow

OBJECT_TYPE = "alert_webhook"


async def _find(session: AsyncSession, tenant_id: str) -> AlertWebhook | None:
    query = select(AlertWebhook).where(AlertWebhook.tenant_id == tenant_id)
    return (await session.scalars(query)).first()


async def _load(session: AsyncSession, principal: Principal, tenant_id: str) -> AlertWebhook:
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    webhook = await _find(session, tenant_id)
    if webhook is None:
        raise NotFound("Webhook")
    return webhook


def _audit(
    session: AsyncSession, ctx: AuditContext, action: str, webhook: AlertWebhook, before: object
) -> None:
    record_event(
        session, ctx=ctx, action=action, object_type=OBJECT_TYPE, object_id=webhook.id,
        tenant_id=webhook.tenant_id, before=before,  # type: ignore[arg-type]
        after=None if action == "webhook.delete" else snapshot(webhook),
    )  # fmt: skip


async def get_webhook(
    session: AsyncSession, *, principal: Principal, tenant_id: str
) -> AlertWebhook:
    return await _load(session, principal, tenant_id)


async def create_webhook(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    tenant_id: str,
    data: WebhookCreate,
    box: SecretBox,
    allow_private: bool,
) -> WebhookCreated:
    await load_tenant(session, principal=ctx.principal, tenant_id=tenant_id)
    url = await check_webhook_url(data.url, allow_private=allow_private)
    secret = new_secret()
    webhook = AlertWebhook(
        id=new_id(), tenant_id=tenant_id, url=url, thresholds=data.thresholds,
        events=data.events, enabled=data.enabled,
    )  # fmt: skip
    webhook.secret_sealed = box.seal(secret, webhook_id=webhook.id)
    session.add(webhook)
    try:
        await session.flush()
    except IntegrityError as exc:
        await session.rollback()
        raise Conflict("The tenant has a webhook; change it with PATCH.") from exc
    _audit(session, ctx, "webhook.create", webhook, None)
    await session.commit()
    return WebhookCreated(**WebhookOut.model_validate(webhook).model_dump(), secret=secret)


async def update_webhook(
    session: AsyncSession,
    *,
    ctx: AuditContext,
    tenant_id: str,
    data: WebhookUpdate,
    allow_private: bool,
) -> AlertWebhook:
    webhook = await _load(session, ctx.principal, tenant_id)
    before = snapshot(webhook)
    if data.url is not None:
        webhook.url = await check_webhook_url(data.url, allow_private=allow_private)
    for name in ("thresholds", "events", "enabled"):
        value = getattr(data, name)
        if value is not None:
            setattr(webhook, name, value)
    webhook.updated_at = utcnow()
    _audit(session, ctx, "webhook.update", webhook, before)
    await session.commit()
    return webhook


async def rotate_secret(
    session: AsyncSession, *, ctx: AuditContext, tenant_id: str, box: SecretBox
) -> WebhookCreated:
    """A new signing secret at once (deliveries from now on are signed with it)."""
    webhook = await _load(session, ctx.principal, tenant_id)
    before = snapshot(webhook)
    secret = new_secret()
    webhook.secret_sealed = box.seal(secret, webhook_id=webhook.id)
    webhook.updated_at = utcnow()
    _audit(session, ctx, "webhook.rotate_secret", webhook, before)
    await session.commit()
    return WebhookCreated(**WebhookOut.model_validate(webhook).model_dump(), secret=secret)


async def delete_webhook(session: AsyncSession, *, ctx: AuditContext, tenant_id: str) -> None:
    webhook = await _load(session, ctx.principal, tenant_id)
    _audit(session, ctx, "webhook.delete", webhook, snapshot(webhook))
    await session.delete(webhook)
    await session.commit()


async def send_test(
    session: AsyncSession, *, ctx: AuditContext, tenant_id: str, now: dt.datetime
) -> str:
    """Enqueue a `webhook.test` event (no once-guard: each call sends one); audited, as it
    makes the gateway send a request."""
    webhook = await _load(session, ctx.principal, tenant_id)
    event_id = new_id()
    await outbox.enqueue(
        session, delivery_id=event_id, tenant_id=tenant_id, event_type=events.WEBHOOK_TEST,
        body=events.test_body(event_id, tenant_id=tenant_id, now=now), now=now,
    )  # fmt: skip
    record_event(
        session, ctx=ctx, action="webhook.test", object_type=OBJECT_TYPE, object_id=webhook.id,
        tenant_id=tenant_id, before=None, after={"delivery_id": event_id, "url": webhook.url},
    )  # fmt: skip
    await session.commit()
    return event_id


async def list_deliveries(
    session: AsyncSession, *, principal: Principal, tenant_id: str, limit: int
) -> list[DeliveryOut]:
    """The tenant's deliveries, newest first, each with its attempts in order."""
    await load_tenant(session, principal=principal, tenant_id=tenant_id)
    rows = list(
        (
            await session.scalars(
                select(AlertDelivery)
                .where(AlertDelivery.tenant_id == tenant_id)
                .order_by(AlertDelivery.created_at.desc(), AlertDelivery.id)
                .limit(limit)
            )
        ).all()
    )
    attempts: dict[str, list[DeliveryAttemptOut]] = {row.id: [] for row in rows}
    if rows:
        found = await session.scalars(
            select(AlertDeliveryAttempt)
            .where(AlertDeliveryAttempt.delivery_id.in_(list(attempts)))
            .order_by(AlertDeliveryAttempt.attempt)
        )
        for attempt in found.all():
            attempts[attempt.delivery_id].append(DeliveryAttemptOut.model_validate(attempt))
    return [
        DeliveryOut(
            id=row.id,
            event_type=row.event_type,
            status=row.status,
            num_attempts=row.num_attempts,
            last_status_code=row.last_status_code,
            created_at=row.created_at,
            delivered_at=row.delivered_at,
            next_attempt_at=row.next_attempt_at if row.status == outbox.PENDING else None,
            payload=json.loads(row.body),
            attempts=attempts[row.id],
        )
        for row in rows
    ]

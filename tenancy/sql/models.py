"""SQLAlchemy 2 typed ORM: the tenancy schema, shared by SQLite (embedded) and PostgreSQL.

Timestamps are timezone-aware UTC on both backends; secrets are never columns (keys are HMACs).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Stores UTC; SQLite drops the zone, so results are re-tagged as UTC on the way out."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime; tenancy stores aware UTC times only")
        return value.astimezone(dt.UTC)

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    tier: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="active")
    # Bumping the epoch changes the tenant's cache salt, which invalidates its cached prefixes.
    salt_epoch: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(64))
    prefix: Mapped[str] = mapped_column(String(16))
    last_four: Mapped[str] = mapped_column(String(4))
    # HMAC-SHA256(pepper, key) as hex; the key itself is never stored.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # After rotation the old key keeps working until this instant, then it is refused.
    rotation_grace_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    replaced_by_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class QuotaPolicy(Base):
    """Per tenant (api_key_id NULL) or per key; for every model (model NULL) or for one served
    base model's requests (its adapters' included). NULL limits mean unlimited."""

    __tablename__ = "quota_policies"
    __table_args__ = (UniqueConstraint("tenant_id", "api_key_id", "model"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    api_key_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("api_keys.id", ondelete="CASCADE"), nullable=True
    )
    model: Mapped[str | None] = mapped_column(String(256), nullable=True)  # a served base model
    requests_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_concurrent: Mapped[int | None] = mapped_column(Integer, nullable=True)
    daily_token_budget: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    monthly_token_budget: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Currency budgets in micro-units (1e-6 of the currency), charged at the ledger's prices.
    daily_spend_budget_micros: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    monthly_spend_budget_micros: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


def public_unique(name: str, *columns: str) -> Index:
    """Unique among public rows (no owner): a unique constraint treats NULL owners as distinct,
    so the owner-scoped constraint leaves public rows unchecked (migration 0005)."""
    public = text("owner_tenant_id IS NULL")
    return Index(name, *columns, unique=True, sqlite_where=public, postgresql_where=public)


class Adapter(Base):
    """One immutable version of an adapter. Its id is what engines load it under and what the
    prefix cache keys it by; ids are never reused, so no two versions ever share cached blocks."""

    __tablename__ = "adapters"
    __table_args__ = (
        UniqueConstraint("owner_tenant_id", "name", "version"),
        public_unique("uq_adapters_public_version", "name", "version"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # NULL owner: a public adapter, visible to every tenant.
    owner_tenant_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True, index=True
    )
    name: Mapped[str] = mapped_column(String(64))
    # 1, 2, ... per (owner, name): each upload of a name adds the next one.
    version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    base_model: Mapped[str] = mapped_column(String(256))
    rank: Mapped[int] = mapped_column(Integer)
    alpha: Mapped[float] = mapped_column(Float)
    target_modules: Mapped[list[str]] = mapped_column(JSON)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    # Where the directory store keeps its files; NULL when the bytes live in adapter_blobs.
    storage_path: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="ready")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AdapterBlob(Base):
    """An adapter's files, content-addressed: stored once whichever versions share them. `data`
    is NULL when the directory store holds the bytes (the row still records that they exist)."""

    __tablename__ = "adapter_blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AdapterAlias(Base):
    """The name requests use: points at one version, or splits traffic between two (a canary
    gets `canary_weight` percent). Switching is one row update, so it is atomic."""

    __tablename__ = "adapter_aliases"
    __table_args__ = (
        UniqueConstraint("owner_tenant_id", "name"),
        public_unique("uq_adapter_aliases_public_name", "name"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner_tenant_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True, index=True
    )
    name: Mapped[str] = mapped_column(String(64))
    # RESTRICT: a version an alias points at cannot be deleted (the API says so first).
    version_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("adapters.id", ondelete="RESTRICT")
    )
    canary_version_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("adapters.id", ondelete="RESTRICT"), nullable=True
    )
    canary_weight: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class UsageRecord(Base):
    """The usage ledger: one row per request. No foreign keys, so it outlives deleted tenants."""

    __tablename__ = "usage_records"
    __table_args__ = (Index("ix_usage_records_tenant_day", "tenant_id", "day"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(128), unique=True)
    tenant_id: Mapped[str] = mapped_column(String(36))
    api_key_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    model: Mapped[str] = mapped_column(String(256))
    adapter_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    adapter_version: Mapped[int | None] = mapped_column(Integer, nullable=True)  # as served
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # The request's cost in micro-units at the prices of its admission (tenancy/spend/money.py):
    # captured when written, so a later price change never rewrites what was billed.
    cost_micros: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    finish_reason: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    day: Mapped[dt.date] = mapped_column(Date)


class Price(Base):
    """Per 1M tokens, in micro-units of the currency. A row with an adapter overrides its base
    model's row (adapter_id NULL) for requests to that adapter."""

    __tablename__ = "prices"
    __table_args__ = (UniqueConstraint("model", "adapter_id"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    model: Mapped[str] = mapped_column(String(256))
    adapter_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    prompt_micros_per_mtok: Mapped[int] = mapped_column(BigInteger)
    cached_micros_per_mtok: Mapped[int] = mapped_column(BigInteger)
    completion_micros_per_mtok: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AuditEvent(Base):
    """Append-only: one row per admin mutation, with the object's state before and after."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_tenant_time", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    actor: Mapped[str] = mapped_column(String(256))
    actor_tenant_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    tenant_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    action: Mapped[str] = mapped_column(String(64), index=True)
    object_type: Mapped[str] = mapped_column(String(32))
    object_id: Mapped[str] = mapped_column(String(64))
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    client_addr: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class DashboardLogout(Base):
    """A dashboard session its user logged out of before it expired. Sessions are signed cookies
    that every replica accepts on their own; this row is what makes every replica refuse a copy
    of the cookie after logout. A row is useless past `expires_at` (the cookie's own expiry
    refuses it then), so rows older than that are pruned at the next logout."""

    __tablename__ = "dashboard_logouts"

    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), index=True)


class AlertWebhook(Base):
    """A tenant's budget-alert webhook (tenancy/alerts/). The signing secret must be read back
    to sign, so it is stored sealed (AES-GCM under a key derived from the pepper), never clear."""

    __tablename__ = "alert_webhooks"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tenants.id", ondelete="CASCADE"), unique=True
    )
    url: Mapped[str] = mapped_column(String(2048))
    secret_sealed: Mapped[str] = mapped_column(String(256))
    thresholds: Mapped[list[int]] = mapped_column(JSON)  # whole percentages, ascending
    events: Mapped[list[str]] = mapped_column(JSON)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AlertFiring(Base):
    """The once-guard: one row per (subject, budget, period, threshold) ever alerted. Replicas
    that cross the same threshold race on the unique constraint; one insert wins, one alert
    goes out. Outages use budget `outage.<service>` and period `open` (the row is removed when
    the service is back, so the next outage alerts again)."""

    __tablename__ = "alert_firings"
    __table_args__ = (UniqueConstraint("subject", "budget", "period", "threshold"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    subject: Mapped[str] = mapped_column(String(40))
    budget: Mapped[str] = mapped_column(String(64))
    period: Mapped[str] = mapped_column(String(16))
    threshold: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AlertDelivery(Base):
    """One event to deliver (the outbox): written in the transaction that claims its
    once-guard row, sent by whichever replica's worker claims it first (`claimed_until`)."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        Index("ix_alert_deliveries_tenant_time", "tenant_id", "created_at"),
        Index("ix_alert_deliveries_due", "status", "next_attempt_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # the event's id too
    tenant_id: Mapped[str] = mapped_column(String(36), ForeignKey("tenants.id", ondelete="CASCADE"))
    event_type: Mapped[str] = mapped_column(String(64))
    body: Mapped[str] = mapped_column(Text)  # the JSON exactly as signed
    status: Mapped[str] = mapped_column(String(16))  # pending, delivered, failed
    num_attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    claimed_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class AlertDeliveryAttempt(Base):
    """The delivery log: one row per attempt, with the receiver's status or the error."""

    __tablename__ = "alert_delivery_attempts"
    __table_args__ = (UniqueConstraint("delivery_id", "attempt"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    delivery_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("alert_deliveries.id", ondelete="CASCADE")
    )
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(String(200), nullable=True)

"""Pydantic models of the webhook admin API (requests and responses)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tenancy.alerts.events import SUBSCRIBABLE
from tenancy.alerts.targets import MAX_URL_LENGTH

DEFAULT_THRESHOLDS = (50, 80, 100)
MAX_THRESHOLDS = 10


def _thresholds(value: list[int] | None) -> list[int] | None:
    if value is None:
        return None
    if not 1 <= len(value) <= MAX_THRESHOLDS:
        raise ValueError(f"thresholds must hold 1 to {MAX_THRESHOLDS} percentages")
    if any(not 1 <= t <= 100 for t in value):
        raise ValueError("thresholds are whole percentages from 1 to 100")
    return sorted(set(value))


def _events(value: list[str] | None) -> list[str] | None:
    if value is None:
        return None
    unknown = sorted(set(value) - set(SUBSCRIBABLE))
    if unknown or not value:
        raise ValueError(f"events must be some of {list(SUBSCRIBABLE)}")
    return sorted(set(value))


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=MAX_URL_LENGTH)
    thresholds: list[int] = Field(default_factory=lambda: list(DEFAULT_THRESHOLDS))
    events: list[str] = Field(default_factory=lambda: ["budget.threshold"])
    enabled: bool = True

    _check_thresholds = field_validator("thresholds")(_thresholds)
    _check_events = field_validator("events")(_events)


class WebhookUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(default=None, max_length=MAX_URL_LENGTH)
    thresholds: list[int] | None = None
    events: list[str] | None = None
    enabled: bool | None = None

    _check_thresholds = field_validator("thresholds")(_thresholds)
    _check_events = field_validator("events")(_events)


class WebhookOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    tenant_id: str
    url: str
    thresholds: list[int]
    events: list[str]
    enabled: bool
    created_at: dt.datetime
    updated_at: dt.datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="the signing secret; shown once, in this answer only")


class DeliveryAttemptOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    attempt: int
    status_code: int | None
    error: str | None
    started_at: dt.datetime
    finished_at: dt.datetime


class DeliveryOut(BaseModel):
    id: str = Field(description="the event's id (its body's `id`)")
    event_type: str
    status: str = Field(description="pending, delivered or failed")
    num_attempts: int
    last_status_code: int | None
    created_at: dt.datetime
    delivered_at: dt.datetime | None
    next_attempt_at: dt.datetime | None = Field(description="null unless pending")
    payload: dict[str, Any]
    attempts: list[DeliveryAttemptOut]


class TestEventOut(BaseModel):
    delivery_id: str

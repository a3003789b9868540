"""The events a webhook receives, as the JSON bodies that are signed and sent.

Every body has `id` (the event's id, the same on every retry: receivers deduplicate on it),
`type`, `created_at` (ISO 8601 UTC) and `tenant_id`; the rest depends on the type:

- `budget.threshold`: `subject`, `api_key_id` (null for the tenant's own budget), `budget` (the
  policy field, e.g. `daily_token_budget`), `unit` (`tokens`, or `micros`: millionths of
  `LORAGATE_CURRENCY`), `period` (`2026-11-29` or `2026-11`),
  `threshold` (percent), `used`, `limit`, `exhausted` (true when the budget refused a request:
  100% is reached then even if `used` stopped short of `limit`);
- `outage.quota_store`, `outage.engine`: `service`, `detail`;
- `webhook.test`: nothing more (sent by `POST .../webhook/test`).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from tenancy.alerts.budgets import BudgetReading
from tenancy.quota.subjects import key_id_of

BUDGET_THRESHOLD = "budget.threshold"
OUTAGE_QUOTA_STORE = "outage.quota_store"
OUTAGE_ENGINE = "outage.engine"
WEBHOOK_TEST = "webhook.test"
# What a webhook may subscribe to (the test event is always allowed).
SUBSCRIBABLE = (BUDGET_THRESHOLD, OUTAGE_QUOTA_STORE, OUTAGE_ENGINE)
OUTAGE_DETAIL = {
    "quota_store": "The quota store is unreachable: requests are refused with 503.",
    "engine": "No engine could take requests: requests fail with 5xx.",
}


def _body(event_id: str, event_type: str, tenant_id: str, now: dt.datetime, **data: Any) -> str:
    head = {
        "id": event_id,
        "type": event_type,
        "created_at": now.isoformat(),
        "tenant_id": tenant_id,
    }
    return json.dumps({**head, **data}, separators=(",", ":"))


def budget_body(
    event_id: str,
    *,
    tenant_id: str,
    reading: BudgetReading,
    threshold: int,
    exhausted: bool,
    now: dt.datetime,
) -> str:
    return _body(
        event_id, BUDGET_THRESHOLD, tenant_id, now,
        subject=reading.subject, api_key_id=key_id_of(reading.subject), budget=reading.budget,
        unit=reading.unit,
        period=reading.period, threshold=threshold, used=reading.used, limit=reading.limit,
        exhausted=exhausted,
    )  # fmt: skip


def outage_body(event_id: str, *, tenant_id: str, service: str, now: dt.datetime) -> str:
    return _body(
        event_id, f"outage.{service}", tenant_id, now,
        service=service, detail=OUTAGE_DETAIL[service],
    )  # fmt: skip


def test_body(event_id: str, *, tenant_id: str, now: dt.datetime) -> str:
    return _body(event_id, WEBHOOK_TEST, tenant_id, now)

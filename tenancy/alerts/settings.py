"""Budget-alert settings (`LORAGATE_ALERTS__*`): one group inside the tenancy settings."""

from __future__ import annotations

from pydantic import BaseModel, Field


class AlertSettings(BaseModel):
    # Webhook URLs are a server-side request: by default only public addresses are reached
    # (tenancy/alerts/targets.py). Loopback and private ranges are for tests and development.
    allow_private_urls: bool = False
    # Bounded retries: attempt n waits backoff_s * 2**(n-1) after the failure, capped.
    max_attempts: int = Field(default=6, ge=1, le=20)
    backoff_s: float = Field(default=10.0, gt=0)
    backoff_max_s: float = Field(default=3600.0, gt=0)
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    # How often a replica looks for deliveries due (its own are sent at once; this picks up
    # retries and those a replica that stopped left behind).
    poll_interval_s: float = Field(default=2.0, gt=0)
    # How long one replica holds a delivery it is sending before another may take it over.
    claim_s: float = Field(default=60.0, gt=0)
    # The delivery log keeps finished deliveries this long (pruned hourly by each replica).
    retention_days: float = Field(default=30.0, gt=0)
    # An outage alert is sent once per outage; a replica sends no second one for the same
    # service within this many seconds however often the service flaps.
    outage_min_interval_s: float = Field(default=300.0, ge=0)

"""Pydantic models between the tenancy layer and the admin routes (requests and responses)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from tenancy.auth.scopes import Scope

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    tier: str | None = None


class TenantUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    tier: str | None = None
    status: str | None = Field(default=None, pattern=r"^(active|suspended)$")


class TenantOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    tier: str
    status: str
    salt_epoch: int
    created_at: dt.datetime
    updated_at: dt.datetime


def as_utc(value: dt.datetime | None) -> dt.datetime | None:
    """A time without a zone is UTC (what the API documents); one with a zone becomes UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


# Every time a client sends: naive means UTC, never a 500 further down.
UtcDateTime = Annotated[dt.datetime, AfterValidator(as_utc)]


class ApiKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    scopes: list[Scope] = Field(default_factory=lambda: [Scope.INFERENCE], min_length=1)
    expires_at: UtcDateTime | None = None


class ApiKeyRotate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grace_seconds: float | None = Field(default=None, ge=0, le=30 * 86400)


class ApiKeyOut(BaseModel):
    """A key as listed: masked, prefix and last four only."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    tenant_id: str
    name: str
    prefix: str
    last_four: str
    scopes: list[str]
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    rotation_grace_until: dt.datetime | None
    replaced_by_id: str | None
    created_at: dt.datetime


class ApiKeyCreated(ApiKeyOut):
    """The only response that ever carries the clear key."""

    key: str


class QuotaLimitsIn(BaseModel):
    """NULL means unlimited."""

    model_config = ConfigDict(extra="forbid")
    requests_per_minute: int | None = Field(default=None, ge=0)
    tokens_per_minute: int | None = Field(default=None, ge=0)
    max_concurrent: int | None = Field(default=None, ge=0)
    daily_token_budget: int | None = Field(default=None, ge=0)
    monthly_token_budget: int | None = Field(default=None, ge=0)
    # Currency budgets in micro-units (1e-6) of LORAGATE_CURRENCY: 5000000 is 5.00.
    daily_spend_budget_micros: int | None = Field(default=None, ge=0)
    monthly_spend_budget_micros: int | None = Field(default=None, ge=0)


class QuotaPolicyOut(QuotaLimitsIn):
    model_config = ConfigDict(from_attributes=True, extra="ignore")
    tenant_id: str
    api_key_id: str | None
    model: str | None = None  # the served base model it counts; None: every model


class AdapterOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    owner_tenant_id: str | None
    name: str
    version: int  # 1, 2, ... per owner and name; `model: "name@3"` requests one explicitly
    base_model: str
    rank: int
    alpha: float
    target_modules: list[str]
    sha256: str
    size_bytes: int
    status: str
    created_at: dt.datetime


class AliasOut(BaseModel):
    """An adapter name as requests use it: `version` serves 100 - canary_weight percent of
    them, `canary_version` (when set) the rest."""

    owner_tenant_id: str | None
    name: str
    version: int
    version_id: str
    canary_version: int | None
    canary_version_id: str | None
    canary_weight: int
    updated_at: dt.datetime


class AliasSwitch(BaseModel):
    """Point the alias at one version (and drop any canary): a switch, or a rollback."""

    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1)


class CanaryIn(BaseModel):
    """Send `weight` percent of the alias's requests to `version`, the rest to its version."""

    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1)
    weight: int = Field(ge=1, le=99)


class UsageRow(BaseModel):
    tenant_id: str
    day: dt.date
    model: str
    num_requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class AuditEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    actor: str
    actor_tenant_id: str | None
    tenant_id: str | None
    action: str
    object_type: str
    object_id: str
    before: dict[str, object] | None
    after: dict[str, object] | None
    request_id: str | None
    client_addr: str | None
    created_at: dt.datetime

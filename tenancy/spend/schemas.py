"""Pydantic models for prices and spend: amounts travel as decimal strings of the currency
(`"0.150000"`) beside their exact integer micro-units."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tenancy.spend.money import Price, to_micros

_PER_M = "per 1M tokens, in the currency (at most 6 decimals)"


class PriceSpec(BaseModel):
    """Prices per 1M tokens; `cached` defaults to `prompt` (no discount for cached tokens)."""

    model_config = ConfigDict(extra="forbid")
    prompt: Decimal = Field(ge=0, description="uncached prompt tokens, " + _PER_M)
    cached: Decimal | None = Field(
        default=None, ge=0, description="cached prompt tokens, " + _PER_M
    )
    completion: Decimal = Field(ge=0, description="completion tokens, " + _PER_M)

    @model_validator(mode="after")
    def _exact(self) -> PriceSpec:
        self.to_price()  # more than 6 decimals is a 422 naming the field, not a rounding
        return self

    def to_price(self) -> Price:
        return Price(
            prompt_micros_per_mtok=to_micros(self.prompt, field="prompt"),
            cached_micros_per_mtok=to_micros(
                self.prompt if self.cached is None else self.cached, field="cached"
            ),
            completion_micros_per_mtok=to_micros(self.completion, field="completion"),
        )


class PriceIn(PriceSpec):
    model: str = Field(min_length=1, max_length=256, description="the served base model's name")
    adapter_id: str | None = Field(
        default=None, max_length=36, description="an adapter's id: its price overrides the model's"
    )


class PriceOut(BaseModel):
    model: str
    adapter_id: str | None
    currency: str
    prompt: Decimal
    cached: Decimal
    completion: Decimal
    prompt_micros_per_mtok: int
    cached_micros_per_mtok: int
    completion_micros_per_mtok: int
    source: str = Field(description='"database" (the admin API) or "settings" (LORAGATE_PRICES)')
    updated_at: dt.datetime | None


class SpendRow(BaseModel):
    """One group of the ledger: a tenant, a key, or a model (with its adapter)."""

    tenant_id: str | None = None
    api_key_id: str | None = None
    model: str | None = None
    adapter_id: str | None = None
    num_requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_micros: int
    cost: Decimal


class SpendReport(BaseModel):
    tenant_id: str
    currency: str
    since: dt.date | None
    until: dt.date | None
    total: SpendRow
    by_key: list[SpendRow]
    by_model: list[SpendRow]

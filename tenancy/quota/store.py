"""Quota admission: the `QuotaStore` interface and the types both backends share.

Semantics (identical in the in-process and the Redis store, checked by one test suite):
- Windows are sliding: requests and tokens admitted in the last 60 s count against RPM / TPM.
- Admission reserves at once, for every subject (tenant, and the key if it has a policy): one
  request, `reserve_tokens` (prompt + max_tokens) against TPM and the daily and monthly budgets
  (UTC calendar periods), and a concurrency lease that expires after `lease_ttl_s`.
- A rejected request reserves nothing, so it is never counted twice.
- Settlement replaces the reservation with the real count (refunding the rest) and ends the lease;
  it is idempotent. Expired leases are reclaimed on every admission and on every read.
- Currency budgets work as the token budgets do, in micro-units of the currency
  (tenancy/spend/money.py): admission reserves the request's worst-case cost
  (`reserve_micros`), settlement replaces it with the cost of what was used (`used_micros`).
- Checks, in order, per subject: monthly budget, daily budget, monthly spend budget, daily spend
  budget, RPM, TPM, concurrency.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from tenancy.errors import ClientError
from tenancy.ids import RequestId

WINDOW_S = 60.0
# How long an unsettled admission can still be settled (its lease ends much earlier).
PENDING_TTL_S = 86400.0


class Limit(StrEnum):
    MONTHLY = "monthly_token_budget"
    DAILY = "daily_token_budget"
    MONTHLY_SPEND = "monthly_spend_budget_micros"
    DAILY_SPEND = "daily_spend_budget_micros"
    RPM = "requests_per_minute"
    TPM = "tokens_per_minute"
    CONCURRENCY = "max_concurrent"


LIMIT_ORDER = (
    Limit.MONTHLY, Limit.DAILY, Limit.MONTHLY_SPEND, Limit.DAILY_SPEND,
    Limit.RPM, Limit.TPM, Limit.CONCURRENCY,
)  # fmt: skip
BUDGETS = frozenset({Limit.MONTHLY, Limit.DAILY, Limit.MONTHLY_SPEND, Limit.DAILY_SPEND})


@dataclass(frozen=True)
class QuotaLimits:
    """None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    daily_token_budget: int | None = None
    monthly_token_budget: int | None = None
    daily_spend_budget_micros: int | None = None
    monthly_spend_budget_micros: int | None = None

    def get(self, limit: Limit) -> int | None:
        value: int | None = getattr(self, limit.value)
        return value


@dataclass(frozen=True)
class QuotaSubject:
    key: str  # "t:<tenant id>" or "k:<key id>"; never a secret
    limits: QuotaLimits


@dataclass(frozen=True)
class SubjectState:
    """One subject's window after an admission decision (for the x-ratelimit-* headers)."""

    num_requests: int
    num_tokens: int
    requests_reset_s: float  # until the oldest request leaves the window
    tokens_reset_s: float


@dataclass(frozen=True)
class RateLimitInfo:
    limit_requests: int | None
    remaining_requests: int | None
    reset_requests_s: float
    limit_tokens: int | None
    remaining_tokens: int | None
    reset_tokens_s: float

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.limit_requests is not None and self.remaining_requests is not None:
            out["x-ratelimit-limit-requests"] = str(self.limit_requests)
            out["x-ratelimit-remaining-requests"] = str(max(0, self.remaining_requests))
            out["x-ratelimit-reset-requests"] = format_duration(self.reset_requests_s)
        if self.limit_tokens is not None and self.remaining_tokens is not None:
            out["x-ratelimit-limit-tokens"] = str(self.limit_tokens)
            out["x-ratelimit-remaining-tokens"] = str(max(0, self.remaining_tokens))
            out["x-ratelimit-reset-tokens"] = format_duration(self.reset_tokens_s)
        return out


def format_duration(seconds: float) -> str:
    """OpenAI's style: `1s`, `6m0s`, `20ms`."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    total = math.ceil(seconds)
    minutes, secs = divmod(total, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def rate_info(subjects: list[QuotaSubject], states: list[SubjectState]) -> RateLimitInfo:
    """The tightest subject's numbers: the one with the fewest remaining requests / tokens."""
    best_r: tuple[int, int, float] | None = None
    best_t: tuple[int, int, float] | None = None
    for subject, state in zip(subjects, states, strict=True):
        rpm, tpm = subject.limits.requests_per_minute, subject.limits.tokens_per_minute
        if rpm is not None and (best_r is None or rpm - state.num_requests < best_r[1]):
            best_r = (rpm, rpm - state.num_requests, state.requests_reset_s)
        if tpm is not None and (best_t is None or tpm - state.num_tokens < best_t[1]):
            best_t = (tpm, tpm - state.num_tokens, state.tokens_reset_s)
    return RateLimitInfo(
        limit_requests=best_r[0] if best_r else None,
        remaining_requests=best_r[1] if best_r else None,
        reset_requests_s=best_r[2] if best_r else 0.0,
        limit_tokens=best_t[0] if best_t else None,
        remaining_tokens=best_t[1] if best_t else None,
        reset_tokens_s=best_t[2] if best_t else 0.0,
    )


@dataclass(frozen=True)
class Admission:
    """What settlement needs; the gateway keeps it for the life of the request."""

    request_id: RequestId
    subject_keys: tuple[str, ...]
    reserved_tokens: int
    reserved_micros: int  # the worst-case cost charged to the currency budgets
    day: str  # the UTC periods charged at admission; settlement adjusts the same ones
    month: str
    rate: RateLimitInfo


@dataclass(frozen=True)
class QuotaUsage:
    """A subject's current state, as the dashboard and the tests read it."""

    num_requests: int
    num_tokens: int
    num_leases: int
    day_tokens: int
    month_tokens: int
    # Until the oldest request in the 60 s window leaves it (RPM and TPM free up); 0 if empty.
    window_reset_s: float = 0.0
    # Micro-units of the currency charged this UTC day and month (reserved, or settled).
    day_spend_micros: int = 0
    month_spend_micros: int = 0


@dataclass(frozen=True)
class BudgetCharge:
    """What a subject was charged this UTC day and month before a store started (restored from
    the usage ledger into an in-process store)."""

    subject_key: str
    day_tokens: int
    month_tokens: int
    day_micros: int = 0
    month_micros: int = 0


class QuotaExceeded(ClientError):
    """429: a rate limit (retryable) or an exhausted budget (`x-should-retry: false`)."""

    def __init__(
        self, *, limit: Limit, subject_key: str, retry_after_s: float, rate: RateLimitInfo
    ) -> None:
        self.limit = limit
        self.subject_key = subject_key
        self.retry_after_s = retry_after_s
        self.rate = rate
        headers = rate.headers()
        is_budget = limit in BUDGETS
        headers["retry-after"] = str(max(1, math.ceil(retry_after_s)))
        headers["retry-after-ms"] = str(max(0, math.ceil(retry_after_s * 1000)))
        if is_budget:
            headers["x-should-retry"] = "false"
        super().__init__(
            message=f"Quota exceeded: {limit.value}. Retry after {format_duration(retry_after_s)}.",
            status_code=429,
            error_type="insufficient_quota" if is_budget else "rate_limit_error",
            code="insufficient_quota" if is_budget else "rate_limit_exceeded",
            headers=headers,
        )


def periods(now: float) -> tuple[str, str, float, float]:
    """(day key, month key, seconds to next UTC midnight, seconds to next month)."""
    # POSIX time has no leap seconds: every UTC day is 86,400 s, so a day's calendar is computed
    # once (it was a tenth of an admission's CPU, every request, in datetime and strftime).
    day, month, next_day, next_month = _calendar(int(now // 86_400))
    return day, month, next_day - now, next_month - now


@functools.lru_cache(maxsize=4)
def _calendar(day_number: int) -> tuple[str, str, float, float]:
    """(day key, month key, next midnight, first of next month) of one UTC day, as timestamps."""
    day_start = dt.datetime.fromtimestamp(day_number * 86_400, dt.UTC)
    next_day = day_start + dt.timedelta(days=1)
    next_month = (day_start.replace(day=1) + dt.timedelta(days=32)).replace(day=1)
    return (
        day_start.strftime("%Y%m%d"),
        day_start.strftime("%Y%m"),
        next_day.timestamp(),
        next_month.timestamp(),
    )


class QuotaStore(Protocol):
    async def admit(
        self,
        *,
        request_id: RequestId,
        subjects: list[QuotaSubject],
        reserve_tokens: int,
        reserve_micros: int = 0,
    ) -> Admission:
        """Reserve for every subject at once, or raise QuotaExceeded having reserved nothing.
        Admitting a request id again before it is settled returns its admission and reserves
        nothing more: a call resent after a lost reply (tenancy/redis_client.py retries on a
        dropped connection) must not charge twice or fail a request already admitted."""
        ...

    async def settle(self, admission: Admission, *, used_tokens: int, used_micros: int = 0) -> None:
        """Replace the reservations with `used_tokens` and `used_micros` and end the lease;
        idempotent."""
        ...

    async def usage(self, subject_key: str) -> QuotaUsage: ...

    async def close(self) -> None: ...

"""What an alert is about: one budget of one subject in one period, and how full it is.

`BudgetReading` is the one shape every budget kind is read into (a reader per kind: tokens,
currency), so the threshold logic and the once-guard never need to know which kind they look
at. A threshold is a whole percentage of the limit; it is crossed when
`used * 100 >= limit * threshold` (integers: no rounding at the edge), and 100 is also reached
when the budget refuses a request (`exhausted`): admission never lets the charges pass the limit,
and a request's reservation (its prompt plus `max_tokens`, or its worst-case cost) is above what
it is charged, so the charges alone seldom land exactly on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tenancy.quota.store import BUDGETS, Limit, QuotaLimits, QuotaUsage


@dataclass(frozen=True)
class BudgetReading:
    subject: str  # the quota store's subject: "t:<tenant id>" or "k:<key id>"
    budget: str  # the policy field: "daily_token_budget", ...
    unit: str  # "tokens" (or the currency's unit)
    period: str  # the UTC period it counts: "2026-11-29" (a day) or "2026-11" (a month)
    used: int
    limit: int


# A reader turns a subject's limits and its usage (as the quota store counts it) into readings.
BudgetReader = Callable[[str, QuotaLimits, QuotaUsage, str, str], Iterable[BudgetReading]]


def day_period(day: str) -> str:
    """ "20261129" (the quota store's day key) -> "2026-11-29"."""
    return f"{day[:4]}-{day[4:6]}-{day[6:8]}"


def month_period(month: str) -> str:
    return f"{month[:4]}-{month[4:6]}"


def token_readings(
    subject: str, limits: QuotaLimits, usage: QuotaUsage, day: str, month: str
) -> list[BudgetReading]:
    return _readings(
        subject, limits, "tokens",
        ((Limit.DAILY, usage.day_tokens, day_period(day)),
         (Limit.MONTHLY, usage.month_tokens, month_period(month))),
    )  # fmt: skip


def spend_readings(
    subject: str, limits: QuotaLimits, usage: QuotaUsage, day: str, month: str
) -> list[BudgetReading]:
    """Currency budgets, in micro-units of `LORAGATE_CURRENCY` (tenancy/spend/money.py)."""
    return _readings(
        subject, limits, "micros",
        ((Limit.DAILY_SPEND, usage.day_spend_micros, day_period(day)),
         (Limit.MONTHLY_SPEND, usage.month_spend_micros, month_period(month))),
    )  # fmt: skip


def _readings(
    subject: str, limits: QuotaLimits, unit: str, budgets: tuple[tuple[Limit, int, str], ...]
) -> list[BudgetReading]:
    """A reading for each budget the policy sets (a cap of 0 or none is no budget to alert on)."""
    out = []
    for limit, used, period in budgets:
        cap = limits.get(limit)
        if cap is not None and cap > 0:
            out.append(BudgetReading(subject, limit.value, unit, period, used, cap))
    return out


READERS: tuple[BudgetReader, ...] = (token_readings, spend_readings)


def has_budget(limits: QuotaLimits) -> bool:
    """Whether any reader could produce a reading (a subject without budgets is never read)."""
    return any(limits.get(limit) is not None for limit in BUDGETS)


EXHAUSTED = 100


def crossed(reading: BudgetReading, thresholds: Iterable[int], *, exhausted: bool) -> list[int]:
    """The thresholds reached; `exhausted`: the budget has just refused a request."""
    return sorted(
        t
        for t in thresholds
        if reading.used * 100 >= reading.limit * t or (exhausted and t == EXHAUSTED)
    )

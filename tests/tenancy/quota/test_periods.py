"""`periods` (the budgets' UTC day and month, and the seconds left in each) against the calendar
computed from scratch with datetime, around month, year and leap-day boundaries."""

from __future__ import annotations

import datetime as dt
import random

from tenancy.quota.store import periods


def _from_scratch(now: float) -> tuple[str, str, float, float]:
    t = dt.datetime.fromtimestamp(now, dt.UTC)
    day_start = t.replace(hour=0, minute=0, second=0, microsecond=0)
    next_day = day_start + dt.timedelta(days=1)
    next_month = (day_start.replace(day=1) + dt.timedelta(days=32)).replace(day=1)
    return (
        t.strftime("%Y%m%d"),
        t.strftime("%Y%m"),
        (next_day - t).total_seconds(),
        (next_month - t).total_seconds(),
    )


def test_periods_match_the_calendar() -> None:
    edges = [
        dt.datetime(2026, 12, 31, 23, 59, 59, 999_000, tzinfo=dt.UTC),
        dt.datetime(2027, 1, 1, tzinfo=dt.UTC),
        dt.datetime(2028, 2, 28, 23, 59, 59, tzinfo=dt.UTC),
        dt.datetime(2028, 2, 29, 12, tzinfo=dt.UTC),
        dt.datetime(2028, 3, 1, tzinfo=dt.UTC),
        dt.datetime(2026, 11, 30, 23, 59, 59, 500_000, tzinfo=dt.UTC),
    ]
    rng = random.Random(7)
    moments = [e.timestamp() for e in edges] + [rng.uniform(0, 4.1e9) for _ in range(2_000)]
    for now in moments:
        day, month, to_day, to_month = periods(now)
        want = _from_scratch(now)
        assert (day, month) == want[:2], now
        assert abs(to_day - want[2]) < 1e-6 and abs(to_month - want[3]) < 1e-6, now
        assert 0 < to_day <= 86_400 and to_day <= to_month

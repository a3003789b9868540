"""The time ranges the usage and audit pages read: a preset (the last 24 hours by the hour, the
last 7 or 30 days by the day) or custom dates (whole UTC days, both ends included), and how a
chart of the range is bucketed and labelled. A range that cannot be read falls back to the
default preset and says why, naming the field."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
PRESETS = {"24h": "Last 24 hours", "7d": "Last 7 days", "30d": "Last 30 days"}
DEFAULT = "7d"
MAX_DAYS = 366  # a custom range's longest span: one bar a day must stay readable


@dataclass(frozen=True)
class TimeRange:
    key: str  # a PRESETS key or "custom"
    since: dt.datetime  # inclusive, UTC
    until: dt.datetime  # exclusive, UTC
    step: dt.timedelta
    title: str
    from_date: str  # the custom form's fields, as shown
    to_date: str
    error: str = ""

    @property
    def num_buckets(self) -> int:
        return max(1, int((self.until - self.since) / self.step))

    @property
    def label_every(self) -> int:
        return max(1, self.num_buckets // 6)

    @property
    def label_format(self) -> str:
        return "%H:00" if self.step == HOUR else "%b %d"


def _parse_day(value: str, field: str) -> tuple[dt.date | None, str]:
    if not value:
        return None, ""
    try:
        return dt.date.fromisoformat(value), ""
    except ValueError:
        return None, f"{field}: a date, YYYY-MM-DD."


def day_range(from_: str, to: str) -> tuple[dt.datetime | None, dt.datetime | None, str]:
    """Optional custom dates as [since, until] datetimes (the end day included), or an error."""
    start, error = _parse_day(from_.strip(), "from")
    end, error_to = _parse_day(to.strip(), "to")
    error = error or error_to
    since = dt.datetime.combine(start, dt.time(), dt.UTC) if start else None
    # the last day included: up to its last microsecond (list_events' `until` is inclusive)
    until = None
    if end is not None:
        until = dt.datetime.combine(end, dt.time(), dt.UTC) + DAY - dt.timedelta(microseconds=1)
    if since and until and since > until:
        return None, None, "from: the first day must not be after the last."
    return since, until, error


def _preset(key: str, now: dt.datetime, error: str = "") -> TimeRange:
    """The custom form's dates start as the preset's days, to adjust from there."""
    if key == "24h":
        start = now.replace(minute=0, second=0, microsecond=0) - 23 * HOUR
        until, step, title = start + 24 * HOUR, HOUR, "Tokens per hour, last 24 hours (UTC)"
    else:
        days = 30 if key == "30d" else 7
        start = now.replace(hour=0, minute=0, second=0, microsecond=0) - (days - 1) * DAY
        until, step, title = start + days * DAY, DAY, f"Tokens per day, last {days} days (UTC)"
    last = (until - dt.timedelta(microseconds=1)).date()
    return TimeRange(key, start, until, step, title, start.date().isoformat(), last.isoformat(),
                     error)  # fmt: skip


def time_range(key: str, from_: str, to: str, now: dt.datetime) -> TimeRange:
    if key in PRESETS:
        return _preset(key, now)
    if key != "custom":
        return _preset(DEFAULT, now, "range: one of 24h, 7d, 30d or custom.")
    start, error = _parse_day(from_.strip(), "from")
    end, error_to = _parse_day(to.strip(), "to")
    error = error or error_to or ("" if start and end else "from and to: both dates are needed.")
    if not error and start and end:
        if start > end:
            error = "from: the first day must not be after the last."
        elif (end - start).days + 1 > MAX_DAYS:
            error = f"to: a custom range spans at most {MAX_DAYS} days."
    if error or start is None or end is None:
        fallback = _preset(DEFAULT, now, error)
        return replace(fallback, from_date=from_, to_date=to)
    since = dt.datetime.combine(start, dt.time(), dt.UTC)
    title = f"Tokens per day, {start.isoformat()} to {end.isoformat()} (UTC)"
    return TimeRange("custom", since, since + ((end - start).days + 1) * DAY, DAY, title,
                     start.isoformat(), end.isoformat())  # fmt: skip

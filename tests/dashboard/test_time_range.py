"""The usage page's time ranges (issue 45 item 1): presets bucket by the hour or the day and end
where they say; custom dates are whole UTC days, both included; a range that cannot be read
falls back to the last 7 days and names the field."""

from __future__ import annotations

import datetime as dt

from gateway.dashboard.time_range import DAY, HOUR, day_range, time_range

NOW = dt.datetime(2026, 3, 10, 15, 42, tzinfo=dt.UTC)


def test_presets() -> None:
    day = time_range("24h", "", "", NOW)
    assert (day.since, day.until, day.step, day.num_buckets) == (
        dt.datetime(2026, 3, 9, 16, tzinfo=dt.UTC), dt.datetime(2026, 3, 10, 16, tzinfo=dt.UTC),
        HOUR, 24,
    )  # fmt: skip
    month = time_range("30d", "", "", NOW)
    assert month.since == dt.datetime(2026, 2, 9, tzinfo=dt.UTC) and month.num_buckets == 30
    assert month.until == dt.datetime(2026, 3, 11, tzinfo=dt.UTC) and month.step == DAY
    # The custom form starts from the preset's days.
    assert (month.from_date, month.to_date) == ("2026-02-09", "2026-03-10")


def test_custom_days_include_both_ends() -> None:
    span = time_range("custom", "2026-01-30", "2026-02-02", NOW)
    assert span.error == "" and span.num_buckets == 4
    assert span.until - span.since == 4 * DAY and span.since.tzinfo == dt.UTC


def test_bad_ranges_fall_back_and_name_the_field() -> None:
    for key, start, end, field in (
        ("custom", "2026-02-02", "2026-01-30", "from:"),
        ("custom", "yesterday", "2026-01-30", "from:"),
        ("custom", "2026-01-01", "", "from and to:"),
        ("custom", "2024-01-01", "2026-01-01", "to:"),
        ("1y", "", "", "range:"),
    ):
        span = time_range(key, start, end, NOW)
        assert span.error.startswith(field) and span.key == "7d", (key, start, end)
    since, until, error = day_range("2026-01-02", "2026-01-01")
    assert (since, until) == (None, None) and error.startswith("from:")
    since, until, error = day_range("", "2026-01-01")
    assert since is None and until == dt.datetime(2026, 1, 2, tzinfo=dt.UTC) - dt.timedelta(
        microseconds=1) and error == ""  # fmt: skip

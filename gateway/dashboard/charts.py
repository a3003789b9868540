"""Server-made charts: the geometry of a stacked bar chart of tokens per period, by series (a
model or an adapter), computed here and drawn by the template as SVG.

No chart library and no script: the page works offline and without JavaScript, and every bar
carries its numbers (`<title>` for a pointer, `data-*` for tests); the same numbers are in a
table beside the chart for screen readers. Colours are a palette that keeps 3:1 contrast against
the white background (WCAG non-text contrast) and is told apart without colour by the legend
order and the titles.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from tenancy.dashboard_reads import UsagePoint

WIDTH, HEIGHT = 720, 220
# Room for the y labels, the x labels, and a margin; the labels get bigger on a phone (the
# whole chart is scaled down there), so these fit a four-character label at either size.
LEFT, BOTTOM, TOP = 64, 32, 8
PALETTE = ("#1f5fa8", "#b34d00", "#2e7d32", "#8e24aa", "#00796b", "#c2185b", "#5d4037", "#455a64")
OTHER = "other"
MAX_SERIES = len(PALETTE)


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    color: str
    series: str
    start: dt.datetime
    num_tokens: int
    num_requests: int


@dataclass(frozen=True)
class LegendEntry:
    color: str
    series: str
    num_tokens: int
    num_requests: int


@dataclass(frozen=True)
class UsageChart:
    title: str
    width: int
    height: int
    left: int  # where the plot starts: the y labels end just before it
    bars: list[Bar]
    y_ticks: list[tuple[float, str]]  # (y, label)
    x_labels: list[tuple[float, str]]  # (x, label)
    legend: list[LegendEntry]
    num_tokens: int
    num_requests: int


def series_name(point: UsagePoint) -> str:
    return f"{point.model} (adapter)" if point.adapter_id else point.model


def _nice_max(value: int) -> int:
    """The axis top: 1, 2 or 5 times a power of ten, at least `value` (and at least 1)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def compact(n: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:.0f}"


def usage_chart(
    points: list[UsagePoint],
    *,
    title: str,
    start: dt.datetime,
    step: dt.timedelta,
    num_buckets: int,
    label_every: int,
    label_format: str,
) -> UsageChart:
    """Buckets `start + i * step` for i in range(num_buckets); series beyond the palette's size
    (the smallest ones) are summed as `other`."""
    totals: dict[str, list[int]] = {}
    for p in points:
        t = totals.setdefault(series_name(p), [0, 0])
        t[0] += p.num_tokens
        t[1] += p.num_requests
    ranked = sorted(totals, key=lambda s: (-totals[s][0], s))
    kept = ranked[: MAX_SERIES - 1] if len(ranked) > MAX_SERIES else ranked
    colors = {s: PALETTE[i] for i, s in enumerate(kept)}
    if len(ranked) > len(kept):
        colors[OTHER] = PALETTE[-1]

    # cells[bucket][series] = [tokens, requests]
    cells: list[dict[str, list[int]]] = [{} for _ in range(num_buckets)]
    for p in points:
        index = int((p.start - start) / step)
        if 0 <= index < num_buckets:
            name = series_name(p) if series_name(p) in colors else OTHER
            cell = cells[index].setdefault(name, [0, 0])
            cell[0] += p.num_tokens
            cell[1] += p.num_requests

    top = _nice_max(max((sum(c[0] for c in b.values()) for b in cells), default=0))
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM - TOP
    slot = plot_w / num_buckets
    bars: list[Bar] = []
    for i, bucket in enumerate(cells):
        y = float(TOP + plot_h)
        for name in colors:  # the legend's order, bottom up
            if name not in bucket:
                continue
            tokens, requests = bucket[name]
            h = plot_h * tokens / top
            y -= h
            bars.append(
                Bar(x=LEFT + i * slot + 1, y=y, width=max(1.0, slot - 2), height=h,
                    color=colors[name], series=name, start=start + i * step,
                    num_tokens=tokens, num_requests=requests)
            )  # fmt: skip
    ticks = [(TOP + plot_h * (1 - f), compact(top * f)) for f in (0, 0.5, 1)]
    labels = [
        (LEFT + (i + 0.5) * slot, (start + i * step).strftime(label_format))
        for i in range(0, num_buckets, label_every)
    ]
    legend = [
        LegendEntry(
            color, name,
            sum(b.num_tokens for b in bars if b.series == name),
            sum(b.num_requests for b in bars if b.series == name),
        )
        for name, color in colors.items()
    ]  # fmt: skip
    return UsageChart(
        title=title, width=WIDTH, height=HEIGHT, left=LEFT, bars=bars, y_ticks=ticks,
        x_labels=labels, legend=legend, num_tokens=sum(b.num_tokens for b in bars),
        num_requests=sum(b.num_requests for b in bars),
    )  # fmt: skip

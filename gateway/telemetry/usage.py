"""The usage ledger's writer on /metrics: records written, dropped and pending.

Read from the writer at scrape time (its own counters, `UsageWriter.num_written` and
`num_dropped`), so the metrics say exactly what the writer did. A drop means the database was
down long enough for `LORAGATE_USAGE_MAX_PENDING` records to pile up: an alert belongs on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class UsageCounts(Protocol):
    num_written: int
    num_dropped: int

    @property
    def num_pending(self) -> int: ...


class UsageLedgerCollector(Collector):
    def __init__(self) -> None:
        self._writer: UsageCounts | None = None  # set once the app has built its writer

    def watch(self, writer: UsageCounts) -> None:
        self._writer = writer

    def collect(self) -> Iterator[Metric]:
        w = self._writer
        yield CounterMetricFamily(
            "loragate_gateway_usage_records_written",
            "Usage records written to the ledger.",
            value=w.num_written if w else 0,
        )
        yield CounterMetricFamily(
            "loragate_gateway_usage_records_dropped",
            "Usage records dropped because the pending backlog was full (database down).",
            value=w.num_dropped if w else 0,
        )
        yield GaugeMetricFamily(
            "loragate_gateway_usage_records_pending",
            "Usage records waiting to be written.",
            value=w.num_pending if w else 0,
        )

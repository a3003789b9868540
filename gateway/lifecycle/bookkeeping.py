"""Settling the quota and writing the usage record: once per request id, on every exit.

`finish(run)` is the last step of every `Run` (see run.py), and it is idempotent by request id:
a second call for the same id does nothing, and a request that was never admitted has nothing
to settle and no record. An admitted request always gets exactly one record, also when the
engine never saw it (the client left during admission, the engine refused it): then its counts
are 0 and its finish reason `abort` or `rejected`.

What is charged is what the engine was given and produced: the prompts actually submitted plus
every completion token counted by the request's output (up to a stop string).

The usage records go to the ledger through `UsageWriter`, in batches off the request path:
records wait in memory at most `flush_interval_s` (or until `batch_size` are pending) and are
written in one transaction. A database outage keeps them pending and retries; past
`max_pending` the oldest are dropped and counted. `close()` flushes everything left (shutdown).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.errors import EngineFailed
from gateway.telemetry.metrics import GatewayMetrics
from tenancy.alerts.service import AlertService
from tenancy.crud.usage import UsageIn, record_usage_batch
from tenancy.errors import ClientError, QuotaStoreUnavailable
from tenancy.ids import RequestId
from tenancy.quota.store import BUDGETS, QuotaExceeded, QuotaStore
from tenancy.rounds import RoundLoop

if TYPE_CHECKING:
    from gateway.lifecycle.run import Run

log = logging.getLogger(__name__)

# Request ids remembered for idempotency: far more than can be in flight at once.
MAX_REMEMBERED = 65536


class Bookkeeping:
    def __init__(
        self,
        quotas: QuotaStore,
        usage: UsageWriter,
        metrics: GatewayMetrics,
        alerts: AlertService | None = None,
    ) -> None:
        self._quotas = quotas
        self._usage = usage
        self._metrics = metrics
        self._alerts = alerts
        self._finished: OrderedDict[str, None] = OrderedDict()
        self.num_settled = 0

    async def finish(self, run: Run) -> None:
        if self._alerts is not None:
            _watch(run, self._alerts)
        if run.admission is None or run.request_id in self._finished:
            return
        self._finished[run.request_id] = None
        trace = run.trace
        if trace is not None:
            trace.phase("gateway.settle")
        if len(self._finished) > MAX_REMEMBERED:
            self._finished.popitem(last=False)
        output = run.output
        num_completion = output.num_completion_tokens
        cost = run.cost_micros()  # at the price of its admission: the ledger keeps it
        try:
            await self._quotas.settle(
                run.admission,
                used_tokens=run.num_prompt_tokens + num_completion,
                used_micros=cost,
            )
            self.num_settled += 1
            if self._alerts is not None:  # O(1): the thresholds are checked in a task of their own
                self._alerts.settled(run.target.ctx.tenant_id, run.subjects)
        except ClientError as exc:
            # The store is down: the lease expires by itself; the usage ledger stays exact.
            log.warning("quota settlement failed; the lease will expire")
            if self._alerts is not None and isinstance(exc, QuotaStoreUnavailable):
                self._alerts.down("quota_store")
        model = run.target.model
        self._usage.add(
            UsageIn(
                request_id=RequestId(run.request_id),
                tenant_id=run.target.ctx.tenant_id,
                api_key_id=run.target.ctx.key_id,
                model=model.name,
                adapter_id=model.adapter.adapter_id if model.adapter else None,
                adapter_version=model.adapter.version if model.adapter else None,
                prompt_tokens=run.num_prompt_tokens,
                completion_tokens=num_completion,
                cached_tokens=output.num_cached_tokens if run.num_prompt_tokens else 0,
                finish_reason=_finish_reason(run),
                started_at=run.started_at,
                finished_at=dt.datetime.now(dt.UTC),
                cost_micros=cost,
            )
        )
        self._observe(run, num_completion)
        if trace is not None:
            trace.settled(
                finish_reason=_finish_reason(run),
                num_prompt=run.num_prompt_tokens,
                num_completion=num_completion,
            )

    def _observe(self, run: Run, num_completion: int) -> None:
        now = time.perf_counter()
        series = self._metrics.series(run.target.ctx.tenant_id, run.target.model.name)
        series.requests.inc()
        series.prompt_tokens.inc(run.num_prompt_tokens)
        series.completion_tokens.inc(num_completion)
        series.cached_tokens.inc(run.output.num_cached_tokens)
        series.e2e.observe(now - run.started)
        series.overhead.observe(max(0.0, now - run.started - run.engine_wait_s))
        if run.first_token_at is not None:
            series.ttft.observe(max(0.0, run.first_token_at - run.started))


def _watch(run: Run, alerts: AlertService) -> None:
    """What this run tells the alerts: an admission (or a refusal) means the quota store
    answered, a 503 quota_store_unavailable that it did not, a refusal for a budget that the
    budget is exhausted; an engine that took the prompts answered, a 502 before any prompt was
    taken (every engine replica tried) did not."""
    failure = run.failure
    if run.admission is not None:
        alerts.up("quota_store")
    elif isinstance(failure, QuotaStoreUnavailable):
        alerts.down("quota_store")
    elif isinstance(failure, QuotaExceeded) and failure.limit in BUDGETS:
        alerts.up("quota_store")
        subject = next((s for s in run.subjects if s.key == failure.subject_key), None)
        if subject is not None:
            alerts.refused(run.target.ctx.tenant_id, subject, failure.limit.value)
    if run.num_prompt_tokens > 0 and run.engine_error is None:
        alerts.up("engine")
    elif (
        isinstance(failure, EngineFailed)
        and failure.status_code == 502
        and not run.num_prompt_tokens
    ):
        alerts.down("engine")


def _finish_reason(run: Run) -> str:
    if run.engine_error is not None:
        return "error"
    if run.num_prompt_tokens == 0:  # the engine never saw it
        return "abort" if run.is_client_gone or run.is_stopping else "rejected"
    return run.output.finish_reason


class UsageWriter:
    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        *,
        flush_interval_s: float,
        batch_size: int,
        max_pending: int,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._batch_size = batch_size
        self._max_pending = max_pending
        self._pending: deque[UsageIn] = deque()
        self._lock = asyncio.Lock()
        self._rounds = RoundLoop(
            self.flush, name="usage-writer", on_failure=_write_failed, interval_s=flush_interval_s
        )
        self.num_written = 0
        self.num_dropped = 0

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def add(self, record: UsageIn) -> None:
        if len(self._pending) >= self._max_pending:
            self._pending.popleft()
            self.num_dropped += 1
            log.error("usage ledger backlog full; dropped the oldest record")
        self._pending.append(record)
        if len(self._pending) >= self._batch_size:
            self._rounds.wake()

    def start(self) -> None:
        self._rounds.start()

    async def flush(self) -> None:
        """Write every pending record (in batches); raises if the database fails."""
        async with self._lock:
            while self._pending:
                size = min(self._batch_size, len(self._pending))
                batch = [self._pending.popleft() for _ in range(size)]
                try:
                    async with self._sessionmaker() as session:
                        self.num_written += await record_usage_batch(session, records=batch)
                except BaseException:
                    self._pending.extendleft(reversed(batch))  # back in front, in order
                    raise

    async def close(self) -> None:
        # Let a write in progress finish (cancelling it mid-transaction would lose the batch).
        await self._rounds.close()
        try:
            await self.flush()
        except (OperationalError, DBAPIError, OSError) as exc:
            log.error(
                "usage ledger: %d records not written at shutdown (%s)",
                len(self._pending),
                type(exc).__name__,
            )


def _write_failed(exc: Exception) -> None:
    # The records stay pending; the next round retries.
    log.warning("usage ledger write failed (%s); retrying", type(exc).__name__)

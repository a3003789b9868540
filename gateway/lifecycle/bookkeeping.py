"""Settling the quota and writing the usage record: once per request id, on every exit.

`finish(run)` is the last step of every `Run` (see run.py), and it is idempotent by request id:
a second call for the same id does nothing, and a request that was never admitted has nothing
to settle and no record. An admitted request always gets exactly one record, also when the
engine never saw it (the client left during admission, the engine refused it): then its counts
are 0 and its finish reason `abort` or `rejected`.

What is charged is what the engine was given and produced: the prompts actually submitted plus
every completion token counted by the request's output (up to a stop string).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from gateway.lifecycle.usage_writer import UsageWriter
from gateway.metrics import GatewayMetrics
from tenancy.crud.usage import UsageIn
from tenancy.errors import TenancyError
from tenancy.ids import RequestId
from tenancy.quotas import QuotaStore

if TYPE_CHECKING:
    from gateway.lifecycle.run import Run

log = logging.getLogger(__name__)

# Request ids remembered for idempotency: far more than can be in flight at once.
MAX_REMEMBERED = 65536


class Bookkeeping:
    def __init__(self, quotas: QuotaStore, usage: UsageWriter, metrics: GatewayMetrics) -> None:
        self._quotas = quotas
        self._usage = usage
        self._metrics = metrics
        self._finished: OrderedDict[str, None] = OrderedDict()
        self.num_settled = 0

    async def finish(self, run: Run) -> None:
        if run.admission is None or run.request_id in self._finished:
            return
        self._finished[run.request_id] = None
        if len(self._finished) > MAX_REMEMBERED:
            self._finished.popitem(last=False)
        output = run.output
        num_completion = output.num_completion_tokens
        try:
            await self._quotas.settle(
                run.admission, used_tokens=run.num_prompt_tokens + num_completion
            )
            self.num_settled += 1
        except TenancyError:
            # The store is down: the lease expires by itself; the usage ledger stays exact.
            log.warning("quota settlement failed; the lease will expire")
        model = run.target.model
        self._usage.add(
            UsageIn(
                request_id=RequestId(run.request_id),
                tenant_id=run.target.ctx.tenant_id,
                api_key_id=run.target.ctx.key_id,
                model=model.name,
                adapter_id=model.adapter.adapter_id if model.adapter else None,
                prompt_tokens=run.num_prompt_tokens,
                completion_tokens=num_completion,
                cached_tokens=output.num_cached_tokens if run.num_prompt_tokens else 0,
                finish_reason=_finish_reason(run),
                started_at=run.started_at,
                finished_at=dt.datetime.now(dt.UTC),
            )
        )
        self._observe(run, num_completion)

    def _observe(self, run: Run, num_completion: int) -> None:
        now = time.perf_counter()
        m = self._metrics
        labels = m.labels(run.target.ctx.tenant_id, run.target.model.name)
        m.requests.labels(*labels).inc()
        m.prompt_tokens.labels(*labels).inc(run.num_prompt_tokens)
        m.completion_tokens.labels(*labels).inc(num_completion)
        m.cached_tokens.labels(*labels).inc(run.output.num_cached_tokens)
        m.e2e.labels(*labels).observe(now - run.started)
        m.overhead.labels(*labels).observe(max(0.0, now - run.started - run.engine_wait_s))
        if run.first_token_at is not None:
            m.ttft.labels(*labels).observe(max(0.0, run.first_token_at - run.started))


def _finish_reason(run: Run) -> str:
    if run.engine_error is not None:
        return "error"
    if run.num_prompt_tokens == 0:  # the engine never saw it
        return "abort" if run.is_client_gone or run.is_stopping else "rejected"
    return run.output.finish_reason

"""One admitted inference request's bookkeeping: quota admission, then, however it ends (done,
failed, client gone), exactly one settlement, one usage record and one set of metrics.

`finish` is shielded from cancellation, so it completes even when the client's disconnect
cancels the task that runs the request.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from typing import Protocol

import anyio
from fastapi import Request

from gateway.coordinator import EngineTarget, GenerationPlan
from gateway.generation import Generation
from gateway.policy import ResolvedModel, TenantContext
from gateway.state import GatewayState
from tenancy.crud.usage import UsageIn
from tenancy.errors import TenancyError
from tenancy.ids import RequestId
from tenancy.quotas import Admission

log = logging.getLogger(__name__)


class Accounting(Protocol):
    """What a finished request reports, whatever produced it (coordinator or pass-through)."""

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_completion_tokens(self) -> int: ...

    @property
    def num_cached_tokens(self) -> int: ...

    @property
    def finish_reason(self) -> str: ...

    @property
    def engine_wait_s(self) -> float: ...

    @property
    def first_token_at(self) -> float | None: ...


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class InferenceRun:
    def __init__(
        self,
        state: GatewayState,
        ctx: TenantContext,
        model: ResolvedModel,
        *,
        request_id: str,
        started: float,
        hint_priority: int | None,
    ) -> None:
        self.state = state
        self.ctx = ctx
        self.model = model
        self.request_id = request_id
        self.started = started  # time.perf_counter() when the request arrived
        self.started_at = dt.datetime.now(dt.UTC)
        self.priority = state.policy.priority(ctx, hint_priority)
        self.admission: Admission | None = None
        self.accounting: Accounting | None = None
        self._finished = False
        self.labels = state.metrics.labels(ctx.tenant_id, model.name)

    @classmethod
    async def begin(
        cls,
        state: GatewayState,
        request: Request,
        ctx: TenantContext,
        model: str,
        *,
        prefix: str,
        hint_priority: int | None = None,
    ) -> InferenceRun:
        """Resolve the model (404 for what this tenant may not see) and name the request."""
        resolved = await state.policy.resolve(ctx, model)
        request.state.lg_model = resolved.name
        return cls(
            state,
            ctx,
            resolved,
            request_id=new_request_id(prefix),
            started=request.state.started,
            hint_priority=hint_priority,
        )

    @property
    def target(self) -> EngineTarget:
        return EngineTarget(
            request_id=self.request_id, ctx=self.ctx, model=self.model, priority=self.priority
        )

    async def admit(self, reserve_tokens: int) -> None:
        subjects = await self.state.policy.subjects(self.ctx)
        self.admission = await self.state.tenancy.quotas.admit(
            request_id=RequestId(self.request_id), subjects=subjects, reserve_tokens=reserve_tokens
        )

    async def start(self, plan: GenerationPlan) -> Generation:
        """Admit, then submit to the engine. Rejections before this point reserve nothing."""
        await self.admit(plan.reserve_tokens)
        coordinator = self.state.coordinator
        generation = coordinator.generation(
            plan, coordinator.engine_requests(plan, self.target), self.model.adapter
        )
        await generation.start()  # an engine rejection settles with nothing used, no record
        self.accounting = generation
        return generation

    def headers(self) -> dict[str, str]:
        headers = self.admission.rate.headers() if self.admission is not None else {}
        headers["x-loragate-overhead-ms"] = f"{self.overhead_s() * 1000:.3f}"
        return headers

    def overhead_s(self) -> float:
        engine = self.accounting.engine_wait_s if self.accounting is not None else 0.0
        return max(0.0, time.perf_counter() - self.started - engine)

    async def finish(self) -> None:
        """Settle, record usage and observe metrics, once; safe from cancellation."""
        if self._finished:
            return
        self._finished = True
        with anyio.CancelScope(shield=True):
            await self._settle()
        self._record()

    async def _settle(self) -> None:
        if self.admission is None:
            return
        acc = self.accounting
        used = acc.num_prompt_tokens + acc.num_completion_tokens if acc is not None else 0
        try:
            await self.state.tenancy.quotas.settle(self.admission, used_tokens=used)
        except TenancyError:
            # The store is down: the lease expires by itself; the usage ledger stays exact.
            log.warning("quota settlement failed; the lease will expire")

    def _record(self) -> None:
        acc = self.accounting
        if self.admission is None or acc is None:
            return
        now = time.perf_counter()
        self.state.usage.add(
            UsageIn(
                request_id=RequestId(self.request_id),
                tenant_id=self.ctx.tenant_id,
                api_key_id=self.ctx.key_id,
                model=self.model.name,
                adapter_id=self.model.adapter.adapter_id if self.model.adapter else None,
                prompt_tokens=acc.num_prompt_tokens,
                completion_tokens=acc.num_completion_tokens,
                cached_tokens=acc.num_cached_tokens,
                finish_reason=acc.finish_reason,
                started_at=self.started_at,
                finished_at=dt.datetime.now(dt.UTC),
            )
        )
        metrics = self.state.metrics
        labels = self.labels
        metrics.requests.labels(*labels).inc()
        metrics.prompt_tokens.labels(*labels).inc(acc.num_prompt_tokens)
        metrics.completion_tokens.labels(*labels).inc(acc.num_completion_tokens)
        metrics.cached_tokens.labels(*labels).inc(acc.num_cached_tokens)
        metrics.e2e.labels(*labels).observe(now - self.started)
        metrics.overhead.labels(*labels).observe(max(0.0, now - self.started - acc.engine_wait_s))
        if acc.first_token_at is not None:
            metrics.ttft.labels(*labels).observe(max(0.0, acc.first_token_at - self.started))

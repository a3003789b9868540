"""The request lifecycle: the one owner of every inference request, whatever its route.

    route -> serve(request, ctx, job)
               plan      resolve the model (404), name the request, clamp its priority, plan
                         the job (4xx); nothing is reserved yet
               run       a `Run` in a task of its own: admit -> open engine streams ->
                         stream/collect -> settle + record (run.py, bookkeeping.py)
               respond   whole or streamed, from the run's answer (responder.py)

Shutdown (`drain`): new requests get 503 at once; runs in flight have until the grace period,
then each is stopped (its engine requests aborted, its client sent an error event and
`[DONE]`), and every run's settlement and usage record are done before `drain` returns.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid

from fastapi import Request
from starlette.responses import Response

from gateway.engines.api import EngineClient
from gateway.errors import ShuttingDown
from gateway.lifecycle.bookkeeping import Bookkeeping
from gateway.lifecycle.job import EngineTarget, Job
from gateway.lifecycle.planner import Planner
from gateway.lifecycle.responder import respond
from gateway.lifecycle.run import Run
from gateway.policy import PolicyService, TenantContext
from gateway.settings import GatewaySettings
from tenancy.quotas import QuotaStore

log = logging.getLogger(__name__)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class RequestLifecycle:
    def __init__(
        self,
        *,
        settings: GatewaySettings,
        policy: PolicyService,
        planner: Planner,
        engine: EngineClient,
        quotas: QuotaStore,
        books: Bookkeeping,
    ) -> None:
        self._settings = settings
        self.policy = policy
        self.planner = planner
        self.engine = engine
        self._quotas = quotas
        self.books = books
        self._runs: set[Run] = set()
        self.is_draining = False

    @property
    def num_in_flight(self) -> int:
        return len(self._runs)

    async def serve(self, request: Request, ctx: TenantContext, job: Job) -> Response:
        if self.is_draining:
            raise ShuttingDown()
        model = await self.policy.resolve(ctx, job.model)
        request.state.lg_model = model.name  # the rejection metrics' label from here on
        target = EngineTarget(
            request_id=new_request_id(job.id_prefix),
            ctx=ctx,
            model=model,
            priority=self.policy.priority(ctx, job.priority_hint),
        )
        plan = job.plan(self.planner, target)
        subjects = await self.policy.subjects(ctx)
        if self.is_draining:  # checked again after the awaits: a run is refused or tracked
            raise ShuttingDown()
        run = Run(
            target,
            plan,
            stream=job.stream,
            started=request.state.started,
            started_at=dt.datetime.now(dt.UTC),
            engine=self.engine,
            quotas=self._quotas,
            subjects=subjects,
            books=self.books,
            abort_timeout_s=self._settings.engine_abort_timeout_s,
        )
        self._runs.add(run)
        run.start().add_done_callback(lambda _: self._runs.discard(run))
        return await respond(request, run, keepalive_s=self._settings.sse_keepalive_s)

    async def drain(self, grace_s: float) -> None:
        """Refuse new requests; give the ones in flight `grace_s`, then stop them; return once
        every run has settled and recorded."""
        self.is_draining = True
        if not self._runs:
            return
        log.info("draining %d requests (grace %.1fs)", len(self._runs), grace_s)
        deadline = time.monotonic() + grace_s
        while self._runs and time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        while self._runs:
            left = set(self._runs)
            log.info("grace period over: stopping %d requests", len(left))
            for run in left:
                run.stop()
            await asyncio.gather(*(run.wait() for run in left))

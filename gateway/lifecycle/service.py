"""The request lifecycle: the one owner of every inference request, whatever its route.

    route -> serve(request, ctx, job)
               plan      resolve the model (404), name the request, clamp its priority, plan
                         the job (4xx) on its base model's pool (its tokenizer and limits),
                         check its output constraint in full (grammars.py, 400); nothing is
                         reserved yet
               run       a `Run` in a task of its own: admit -> open engine streams ->
                         stream/collect -> settle + record (run.py, bookkeeping.py)
               respond   whole or streamed, from the run's answer (`respond`, below)

Shutdown (`drain`): new requests get 503 at once; runs in flight have until the grace period,
then each is stopped (its engine requests aborted, its client sent an error event and
`[DONE]`), and every run's settlement and usage record are done before `drain` returns.

The responder waits for the run's answer while listening for the client's disconnect.
Streaming waits for the first engine event before sending headers, so every error that can
happen before the first token (quota, engine rejection, every replica down) is a proper HTTP
status; after that, bytes come from the run's `events` until its `None`, with a `: keep-alive`
comment whenever the engine has been silent for `keepalive_s` (a queued request). However the
HTTP side ends (done, the client gone, a broken socket, its task cancelled), it tells the run
with `client_gone()`, which is synchronous and idempotent: the run, in its own task, stops the
engine and keeps the books. Nothing on the HTTP side awaits bookkeeping.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Protocol

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from engine.protocol import wait_for_disconnect
from gateway.engines.api import EngineClient
from gateway.engines.pools import ModelPool
from gateway.errors import ClientGone, ShuttingDown
from gateway.lifecycle.bookkeeping import Bookkeeping
from gateway.lifecycle.grammars import GrammarChecks
from gateway.lifecycle.job import EngineTarget, Job, Planner
from gateway.lifecycle.run import Run
from gateway.policy import PolicyService, ResolvedModel, TenantContext
from gateway.settings import GatewaySettings
from gateway.telemetry.tracing import Tracing, route_of
from tenancy.quota.store import QuotaStore

log = logging.getLogger(__name__)

KEEPALIVE = b": keep-alive\n\n"


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
        tracing: Tracing | None = None,
        others: Mapping[str, ModelPool] | None = None,
    ) -> None:
        """`planner` and `engine`: the primary base model's; `others`: the pools of the other
        served base models, by name (gateway/engines/pools.py)."""
        self._settings = settings
        self.policy = policy
        self.planner = planner
        self.engine = engine
        self.others = dict(others or {})
        self._quotas = quotas
        self.books = books
        self.tracing = tracing  # None: off (tests may set it after construction)
        # through self.engine, which tests may wrap after construction
        self._grammars = GrammarChecks(lambda spec: self.engine.check_constraint(spec))
        self._runs: set[Run] = set()
        self.is_draining = False
        self._drain_task: asyncio.Task[None] | None = None

    @property
    def num_in_flight(self) -> int:
        return len(self._runs)

    async def serve(self, request: Request, ctx: TenantContext, job: Job) -> Response:
        if self.is_draining:
            raise ShuttingDown()
        trace = None
        if self.tracing is not None:  # the run ends it; until then, a refusal here does
            trace = self.tracing.begin(
                started=request.state.started,
                auth=getattr(request.state, "lg_auth", None),
                path=route_of(request.scope),
                tenant_id=ctx.tenant_id,
            )
        try:
            model = await self.policy.resolve(ctx, job.model)
            request.state.lg_model = model.name  # the rejection metrics' label from here on
            target = EngineTarget(
                request_id=new_request_id(job.id_prefix),
                ctx=ctx,
                model=model,
                priority=self.policy.priority(ctx, job.priority_hint),
            )
            planner, engine, grammars = self._pool_of(model)
            plan = job.plan(planner, target)
            await grammars.check(plan)
            # the base model counts (an adapter's included), never the name the client gave
            subjects = await self.policy.subjects(ctx, model.base_model)
            if self.is_draining:  # checked again after the awaits: a run is refused or tracked
                raise ShuttingDown()
        except BaseException as exc:
            if trace is not None:
                trace.refused(exc)
            raise
        run = Run(
            target,
            plan,
            stream=job.stream,
            started=request.state.started,
            started_at=dt.datetime.now(dt.UTC),
            engine=engine,
            quotas=self._quotas,
            subjects=subjects,
            books=self.books,
            abort_timeout_s=self._settings.engine_abort_timeout_s,
            trace=trace,
        )
        self._runs.add(run)
        run.start().add_done_callback(lambda _: self._runs.discard(run))
        return await respond(request, run, keepalive_s=self._settings.sse_keepalive_s)

    def _pool_of(self, model: ResolvedModel) -> tuple[Planner, EngineClient, GrammarChecks]:
        """Where a resolved model runs: its base model's pool; the primary's through
        `self.planner` and `self.engine` (which tests may wrap after construction)."""
        pool = self.others.get(model.base_model)
        if pool is None:
            return self.planner, self.engine, self._grammars
        return pool.planner, pool.engine, pool.grammars

    def begin_drain(self, grace_s: float) -> asyncio.Task[None]:
        """Start draining (once; later calls return the same task)."""
        if self._drain_task is None:
            self.is_draining = True
            self._drain_task = asyncio.create_task(self._drain(grace_s), name="drain")
        return self._drain_task

    async def drain(self, grace_s: float) -> None:
        """Refuse new requests; give the ones in flight `grace_s`, then stop them; return once
        every run has settled and recorded."""
        await asyncio.shield(self.begin_drain(grace_s))

    async def _drain(self, grace_s: float) -> None:
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


# ---- the HTTP side of a run -------------------------------------------------------------------


async def respond(request: Request, run: Run, *, keepalive_s: float) -> Response:
    watch: asyncio.Future[None] = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait((run.answer, watch), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        run.client_gone()  # this task was cancelled; the run is not
        raise
    finally:
        watch.cancel()
    if not run.answer.done():
        run.client_gone()
        raise ClientGone()
    first = run.answer.result()  # raises the run's error: its HTTP status
    headers = response_headers(run)
    if not run.is_streamed:
        return Response(first, headers=headers, media_type="application/json")
    return EventStreamResponse(run, first, headers=headers, keepalive_s=keepalive_s)


def response_headers(run: Run) -> dict[str, str]:
    headers = run.admission.rate.headers() if run.admission is not None else {}
    overhead = max(0.0, time.perf_counter() - run.started - run.engine_wait_s)
    headers["x-loragate-overhead-ms"] = f"{overhead * 1000:.3f}"
    return headers


class EventSource(Protocol):
    """What the streamed response needs of a run."""

    events: asyncio.Queue[bytes | None]

    def client_gone(self) -> None: ...

    def first_sent(self) -> None: ...


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self, run: EventSource, first: bytes, *, headers: dict[str, str], keepalive_s: float
    ) -> None:
        # No body: init_headers then sets no content-length (the length is unknown).
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no", **headers})
        self._run = run
        self._first = first
        self._keepalive_s = keepalive_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run = self._run
        watch = asyncio.ensure_future(wait_for_disconnect(receive))
        watch.add_done_callback(lambda _: run.client_gone())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if self._first:
                await send({"type": "http.response.body", "body": self._first, "more_body": True})
            run.first_sent()
            while not watch.done():
                body, ended = _drain(await self._next(run.events), run.events)
                if body:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                if ended:
                    break
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # a send to a closed socket: the client is gone (client_gone below)
        finally:
            watch.cancel()
            run.client_gone()

    async def _next(self, events: asyncio.Queue[bytes | None]) -> bytes | None:
        """The next chunk; a keep-alive comment after `keepalive_s` of silence. A chunk already
        queued is taken without arming a timer (most are, under load)."""
        if not events.empty():
            return events.get_nowait()
        try:
            async with asyncio.timeout(self._keepalive_s):
                return await events.get()
        except TimeoutError:
            return KEEPALIVE


def _drain(first: bytes | None, events: asyncio.Queue[bytes | None]) -> tuple[bytes, bool]:
    """`first` and every chunk queued behind it, joined, and whether the run's end (None) was
    among them. A gateway behind its engine catches up in one send instead of one per event
    (each an ASGI message, a chunk header and a system call); events stay whole SSE events."""
    parts: list[bytes] = []
    chunk = first
    while chunk is not None:
        parts.append(chunk)
        if events.empty():
            return b"".join(parts), False
        chunk = events.get_nowait()
    return b"".join(parts), True

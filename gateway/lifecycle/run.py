"""One inference request, from admission to settlement, driven by a task of its own.

The route's task only waits for `answer` and relays `events`; nothing that happens to it (the
client leaving, a cancellation, a broken socket) reaches this task. It admits, opens the engine
streams, feeds their events to the request's `Output` and ends, on every path, in the same
`finally`: close the engine streams, then settle and record once (`Bookkeeping.finish`).

Ending early never cuts the engine off mid-count: the client leaving, a stop string and
shutdown all `abort()` the engine requests and read on to the engine's last event, so the ledger
holds exactly what the engine produced. Only an engine that does not confirm an abort within
`abort_timeout_s` is cut off (then the ledger holds what arrived).

Invariant: `answer` is resolved exactly once: with the first bytes (streamed) or the body
(whole), or with the error to answer as an HTTP status. Streamed, every byte after the first
goes through `events`, which ends with `None`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import traceback
from typing import TYPE_CHECKING

from engine.protocol import GenerateResponse
from gateway.engines.api import EngineClient, EngineStream, EngineStreamError
from gateway.errors import EngineFailed, ShuttingDown
from gateway.lifecycle.job import EngineTarget, Plan
from tenancy.errors import ClientError
from tenancy.ids import RequestId
from tenancy.quota.store import Admission, QuotaStore, QuotaSubject
from tenancy.spend.money import cost_micros, worst_case_micros

if TYPE_CHECKING:
    from gateway.lifecycle.bookkeeping import Bookkeeping
    from gateway.telemetry.tracing import RequestTrace

log = logging.getLogger(__name__)

ENGINE_FAILED = "The engine failed while generating."
SHUTTING_DOWN = "The gateway is shutting down; retry the request."
# The most a run waits for its responder to send a stream's first bytes (normally one turn of
# the event loop; the bound only matters if the responder never calls back).
HAND_OVER_S = 1.0


class Run:
    def __init__(
        self,
        target: EngineTarget,
        plan: Plan,
        *,
        stream: bool,
        started: float,
        started_at: dt.datetime,
        engine: EngineClient,
        quotas: QuotaStore,
        subjects: list[QuotaSubject],
        books: Bookkeeping,
        abort_timeout_s: float,
        trace: RequestTrace | None = None,
    ) -> None:
        self.target = target
        self.plan = plan
        self.output = plan.output
        self.is_streamed = stream
        self.started = started  # time.perf_counter() when the request arrived
        self.started_at = started_at
        self._engine = engine
        self._quotas = quotas
        self._subjects = subjects
        self._books = books
        self._abort_timeout_s = abort_timeout_s
        self.trace = trace  # None: tracing is off
        self._traceparent: str | None = None  # the engine call's, sent with each engine request
        loop = asyncio.get_running_loop()
        self.answer: asyncio.Future[bytes] = loop.create_future()
        self.events: asyncio.Queue[bytes | None] = asyncio.Queue()
        # Streamed: set once the responder has sent the first bytes (or will never send them).
        self._first_sent: asyncio.Future[None] | None = loop.create_future() if stream else None
        self._handing_over = False  # the first bytes are answered, not yet sent
        self.admission: Admission | None = None
        self.num_prompt_tokens = 0  # of the engine requests actually submitted
        self.engine_wait_s = 0.0
        self.first_token_at: float | None = None
        self.engine_error: str | None = None  # the engine failed mid-stream (or a bug here)
        self.is_client_gone = False
        self.is_stopping = False  # the gateway is shutting down
        self._streams: list[EngineStream] = []
        self._open_prompts: set[int] = set()  # prompts whose answer is still coming
        self._aborting = False
        self._is_answered = False  # the answer is complete (or failed); nothing more is sent
        self._deadline: asyncio.Timeout | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def request_id(self) -> str:
        return self.target.request_id

    @property
    def subjects(self) -> list[QuotaSubject]:
        """The quota subjects admission charged (the tenant, and the key with a policy)."""
        return self._subjects

    @property
    def failure(self) -> BaseException | None:
        """The error the request was answered with, once answered with one."""
        if not self.answer.done() or self.answer.cancelled():
            return None
        return self.answer.exception()

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self._drive(), name=f"run-{self.request_id}")
        return self._task

    @property
    def is_finished(self) -> bool:
        return self._task is not None and self._task.done()

    @property
    def reserve_micros(self) -> int:
        """The most this request can cost at its model's price: every prompt planned and every
        token it may generate (tenancy/spend/money.py); what admission holds of a currency
        budget."""
        num_prompt = sum(len(request.token_ids) for request in self.plan.requests)
        return worst_case_micros(
            self.target.model.price,
            prompt_tokens=num_prompt,
            max_completion_tokens=self.plan.reserve_tokens - num_prompt,
        )

    def cost_micros(self) -> int:
        """What it cost: the prompts submitted, their cached part and every completion token
        counted, at the price it was admitted at (never above `reserve_micros`)."""
        num_prompt = self.num_prompt_tokens
        return cost_micros(
            self.target.model.price,
            prompt_tokens=num_prompt,
            cached_tokens=min(num_prompt, self.output.num_cached_tokens) if num_prompt else 0,
            completion_tokens=self.output.num_completion_tokens,
        )

    # ---- signals from outside (synchronous: safe in any `finally`) ------------------------------

    def first_sent(self) -> None:
        """The responder sent the streamed answer's first bytes (or gave up on sending)."""
        if self._first_sent is not None and not self._first_sent.done():
            self._first_sent.set_result(None)

    def client_gone(self) -> None:
        """The client left (or its task was cancelled): stop the engine, keep the books."""
        self.first_sent()  # nothing more will be sent: the run must not wait on it
        if self.is_client_gone or self._is_answered or self.is_finished:
            return  # an answer already complete needs nothing stopped
        self.is_client_gone = True
        self.events.put_nowait(None)  # the responder stops waiting at once
        self._abort_all()

    def stop(self) -> None:
        """Shutdown's deadline passed: the client gets an error event and `[DONE]`."""
        if self.is_stopping or self.is_finished:
            return
        self.is_stopping = True
        self._abort_all()

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.wait({self._task})

    # ---- the task -------------------------------------------------------------------------------

    async def _drive(self) -> None:
        trace = self.trace
        try:
            if trace is not None:
                self._trace_admission(trace)
            self.admission = await self._quotas.admit(
                request_id=RequestId(self.request_id),
                subjects=self._subjects,
                reserve_tokens=self.plan.reserve_tokens,
                reserve_micros=self.reserve_micros,
            )
            if trace is not None:
                trace.phase("gateway.engine", is_client=True)
                self._traceparent = trace.traceparent()
            await self._open()
            await self._pump()
        except ClientError as exc:  # before the answer started: it becomes the HTTP status
            self._fail(exc)
            if trace is not None:
                trace.fail(exc)
        except Exception as exc:  # a bug: answered as a constant 500
            # The message may quote request data: the type and the frames only.
            frames = "".join(traceback.format_tb(exc.__traceback__))
            log.error("request run failed with %s:\n%s", type(exc).__name__, frames)
            self.engine_error = type(exc).__name__
            self._fail(EngineFailed(ENGINE_FAILED))
        finally:
            await self._close_streams()
            if not self.answer.done():  # cancelled from outside (event loop teardown)
                self._fail(ShuttingDown(SHUTTING_DOWN))
            self.events.put_nowait(None)
            if trace is not None and self.engine_error is not None:
                trace.fail("engine_error")
            await self._books.finish(self)
            if trace is not None:
                trace.end()

    def _trace_admission(self, trace: RequestTrace) -> None:
        trace.named(
            request_id=self.request_id, model=self.target.model.name, is_streamed=self.is_streamed
        )
        trace.phase("gateway.admission")

    async def _open(self) -> None:
        """Submit every engine request; the first rejection is raised (the others abort)."""
        for prompt, request in enumerate(self.plan.requests):
            if self.is_client_gone or self.is_stopping:
                return
            stream = await self._engine.open(
                request, self.target.model.adapter, traceparent=self._traceparent
            )
            self._streams.append(stream)
            self._open_prompts.add(prompt)
            self.num_prompt_tokens += len(request.token_ids)
            if self._aborting:  # the client left while this one was being submitted
                stream.abort()

    async def _pump(self) -> None:
        if not self._streams:
            return
        try:
            try:
                async with asyncio.timeout(None) as self._deadline:
                    if self._aborting:
                        self._arm_deadline()
                    if len(self._streams) == 1:
                        await self._read_one()
                    else:
                        await self._read_merged()
            finally:
                self._deadline = None  # an exited timeout cannot be rescheduled
        except TimeoutError:
            log.warning("an engine did not end an aborted request in time; cut off")
        except EngineStreamError as exc:
            # The other prompts' requests are aborted; their streams close in `_drive`.
            self.engine_error = exc.message
            self.output.end("error")
            self._abort_all()
            self._answer_failure(ENGINE_FAILED)
            return
        self._answer_end()

    async def _read_one(self) -> None:
        events = self._streams[0].__aiter__()
        while True:
            waited = time.perf_counter()
            try:
                event = await anext(events)
            except StopAsyncIteration:
                break
            finally:
                self.engine_wait_s += time.perf_counter() - waited
            self._on_event(0, event)
            if self._handing_over:
                await self._hand_over()
        self._prompt_ended(0)

    async def _hand_over(self) -> None:
        """Streamed: let the responder send the first bytes before the events behind them are
        worked through. An engine's events can arrive in a burst (one read holds many); each
        would otherwise be decoded and queued before the client saw its first byte. Bounded:
        a responder that never calls back costs at most HAND_OVER_S."""
        self._handing_over = False
        sent = self._first_sent
        if sent is not None and not sent.done():
            await asyncio.wait((sent,), timeout=HAND_OVER_S)

    async def _read_merged(self) -> None:
        queue: asyncio.Queue[tuple[int, GenerateResponse | EngineStreamError | None]]
        queue = asyncio.Queue()

        async def read(prompt: int) -> None:
            try:
                async for event in self._streams[prompt]:
                    queue.put_nowait((prompt, event))
            except EngineStreamError as exc:
                queue.put_nowait((prompt, exc))
                return
            queue.put_nowait((prompt, None))

        readers = [asyncio.create_task(read(i)) for i in range(len(self._streams))]
        try:
            running = len(readers)
            while running:
                waited = time.perf_counter()
                prompt, item = await queue.get()
                self.engine_wait_s += time.perf_counter() - waited
                if item is None:
                    running -= 1
                    self._prompt_ended(prompt)
                elif isinstance(item, EngineStreamError):
                    raise item
                else:
                    self._on_event(prompt, item)
                    if self._handing_over:
                        await self._hand_over()
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    # ---- events -> the client's answer ----------------------------------------------------------

    def _on_event(self, prompt: int, event: GenerateResponse) -> None:
        # Every event is counted, also after an abort: the ledger holds what the engine made
        # (a choice ended by a stop string counts nothing past it).
        output = self.output
        data = output.feed(prompt, event)
        if self.first_token_at is None and any(c.token_ids for c in event.choices):
            self.first_token_at = time.perf_counter()
        if prompt not in self._open_prompts:
            return  # answered already; what comes now is the engine confirming an abort
        if self.is_streamed and not self.is_client_gone:
            if not self.answer.done():
                self.answer.set_result(output.head() + data)
                self._handing_over = True
            elif data:
                self.events.put_nowait(data)
        if output.is_prompt_done(prompt):
            self._streams[prompt].abort()  # a stop string: the engine need not go on
            self._prompt_ended(prompt)

    def _prompt_ended(self, prompt: int) -> None:
        """This prompt's answer is complete; the whole answer goes out once all are."""
        self._open_prompts.discard(prompt)
        if not self._open_prompts:
            self._answer_end()

    def _answer_end(self) -> None:
        """The engine streams ended (or every prompt's answer is complete): answer in full."""
        if self._is_answered:
            return
        closing = self.output.end("abort")  # choices the engine never finished
        if self.is_stopping and self.output.finish_reason == "abort":
            self._answer_failure(SHUTTING_DOWN, status=ShuttingDown(SHUTTING_DOWN))
            return
        self._is_answered = True
        if not self.is_streamed:
            if not self.answer.done():
                self.answer.set_result(self.output.body())
        elif not self.is_client_gone:
            if not self.answer.done():
                self.answer.set_result(self.output.head() + closing + self.output.tail())
            else:
                self.events.put_nowait(closing + self.output.tail())
        self.events.put_nowait(None)

    def _answer_failure(self, message: str, *, status: ClientError | None = None) -> None:
        if self._is_answered:
            return
        self._is_answered = True
        if not self.answer.done():
            self._fail(status or EngineFailed(message))
        elif self.is_streamed and not self.is_client_gone:
            self.events.put_nowait(self.output.failure(message))
        self.events.put_nowait(None)

    def _fail(self, exc: ClientError) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)
            # The responder retrieves it; a client gone before it looked must not log it.
            self.answer.exception()

    # ---- ending the engine side -----------------------------------------------------------------

    def _abort_all(self) -> None:
        self._aborting = True
        for stream in self._streams:
            stream.abort()
        self._arm_deadline()

    def _arm_deadline(self) -> None:
        deadline = self._deadline
        if deadline is not None and deadline.when() is None:
            deadline.reschedule(asyncio.get_running_loop().time() + self._abort_timeout_s)

    async def _close_streams(self) -> None:
        for stream in self._streams:
            try:
                await stream.aclose()
            except Exception as exc:  # closing must never stop the books from being kept
                log.warning("closing an engine stream failed with %s", type(exc).__name__)

"""The asyncio face of the engine: one loop thread owns the LLMEngine, coroutines talk to it.

Threads and ownership:
- The loop thread is the only thread that touches the LLMEngine. It drains a thread-safe
  command queue between steps, steps while there is work and idles on the queue otherwise.
- By default the AsyncEngine starts that thread; `loragate engine` runs the loop on the
  process's main thread instead (`start_thread=False`, then `run_loop()`) and serves HTTP from
  a thread of its own: on the 2-core bench box the same decode step took 19-21 ms on the main
  thread and 25-28 ms on any other (bench/step_thread.py; torch's OpenMP work runs slower when
  a non-main thread drives it).
- Each request's outputs travel to its `RequestStream` (an asyncio.Queue on the caller's event
  loop) through `loop.call_soon_threadsafe`.
- The loop thread's side is engine/loop/loop_thread.py; the two sides share only `LoopShared`
  (the command queue, the streams and the state flags, under one lock).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from engine.config import EngineConfig
from engine.errors import EngineUnavailableError, InvalidRequestError
from engine.loop.commands import Abort, Add, Call, Reply, Stop, WaitIdle
from engine.loop.loop_thread import LoopShared, LoopThread
from engine.loop.request_stream import RequestStream
from engine.outputs import EngineStats, RequestOutput
from engine.request import EngineRequest, RequestId
from engine.structured.spec import StructuredSpec

if TYPE_CHECKING:
    from engine.loop.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

T = TypeVar("T")


# ---- the engine -----------------------------------------------------------------------------


class AsyncEngine:
    """Runs an LLMEngine on its own thread and serves requests to coroutines.

    The thread starts in the constructor (or, with `start_thread=False`, the caller runs
    `run_loop()` on a thread it chooses); `shutdown` drains and stops the loop.
    """

    def __init__(self, engine: LLMEngine, *, start_thread: bool = True) -> None:
        self.config: EngineConfig = engine.config
        self.vocab_size: int = engine.vocab_size
        self.max_model_len: int = engine.max_model_len
        self.model_name: str = engine.model_name
        self.startup_choices = engine.startup_choices  # the native paths taken, for /metrics
        self._shared = LoopShared()
        self._shutting_down = False  # written under the shared lock
        # Thread-safe on its own (engine/structured/compiler.py): used from the event loop.
        self._grammars = engine.grammars
        self._loop_thread = LoopThread(engine, self._shared)
        if start_thread:
            threading.Thread(
                target=self._loop_thread.run_on_own_thread, name="engine-loop", daemon=True
            ).start()

    @classmethod
    def from_config(cls, config: EngineConfig, *, start_thread: bool = True) -> AsyncEngine:
        from engine.loop.llm_engine import LLMEngine

        return cls(LLMEngine(config), start_thread=start_thread)

    # ---- state --------------------------------------------------------------------------

    @property
    def is_healthy(self) -> bool:
        """The loop thread runs and accepts requests (False once dead, draining or stopped)."""
        shared = self._shared
        with shared.lock:
            accepting = not (shared.is_dead or shared.is_draining or shared.is_stopped)
        return accepting and not self._loop_thread.ended.is_set()

    @property
    def is_dead(self) -> bool:
        return self._shared.is_dead

    @property
    def num_in_flight(self) -> int:
        with self._shared.lock:
            return len(self._shared.streams)

    def stats(self) -> EngineStats:
        """The snapshot taken by the loop thread after its last step."""
        return self._loop_thread.stats

    def _reply(self) -> Reply:
        loop = asyncio.get_running_loop()
        return Reply(loop, loop.create_future())

    # ---- public API (event loop side) ---------------------------------------------------

    async def add_request(self, request: EngineRequest) -> RequestStream:
        """Admit a request; raises its EngineError (400/404/503) before anything streams."""
        shared = self._shared
        spec = request.sampling_params.structured_outputs
        if spec is not None and request.grammar is None:
            with shared.lock:  # nothing compiles for an engine that would refuse the request
                error = shared.unavailable()
            if error is not None:
                raise error
            # compiled here, on the compiler's threads: the loop keeps stepping, and the
            # request holds no batch slot until its grammar is ready (or refused: a 400)
            request = replace(request, grammar=await self._grammars.compile_async(spec))
        stream = RequestStream(request, shared.abandon)
        reply = self._reply()
        with shared.lock:
            error = shared.unavailable()
            if error is not None:
                raise error
            if request.request_id in shared.streams:
                raise InvalidRequestError(
                    "request_id is already in use by a running request", param="request_id"
                )
            if len(shared.streams) >= self.config.max_queue_len:
                raise EngineUnavailableError(
                    f"the engine is overloaded ({self.config.max_queue_len} requests in flight)"
                )
            shared.streams[request.request_id] = stream
            shared.commands.put(Add(stream, reply))
        try:
            await reply.future
        except BaseException:
            shared.forget(stream)
            stream.closed = True
            if reply.future.cancelled():
                # The caller gave up while the loop thread may be admitting the request right
                # now; the abort is queued behind the add, so it cannot miss it.
                shared.queue_abort(stream.request_id)
            raise
        return stream

    async def compile_grammar(self, spec: StructuredSpec) -> None:
        """Compile (and cache) a constraint as add_request would, off the loop: a caller that
        checks before it admits (the gateway in process) pays the compile once. Raises the
        InvalidRequestError a request with it would get."""
        await self._grammars.compile_async(spec)

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Admit (raising before the first output) and yield outputs until the request ends.

        Closing the iterator early (client gone) aborts the request.
        """
        stream = await self.add_request(request)

        async def outputs() -> AsyncIterator[RequestOutput]:
            try:
                async for output in stream:
                    yield output
            finally:
                stream.close()

        return outputs()

    async def abort(self, request_ids: Iterable[str]) -> None:
        """Abort requests that are waiting or running (unknown ids are ignored)."""
        reply = self._reply()
        if self._shared.submit(Abort([RequestId(request_id) for request_id in request_ids], reply)):
            await reply.future

    def abort_nowait(self, request_id: str) -> None:
        """Queue an abort and return at once (safe in any `finally`); the request's stream
        still receives its final output (finish reason `abort`) if it is listening."""
        self._shared.queue_abort(RequestId(request_id))

    async def run_in_loop(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(engine)` on the loop thread between steps (the engine is not thread-safe)."""
        reply = self._reply()
        if not self._shared.submit(Call(fn, reply)):
            raise EngineUnavailableError("the engine loop is not running")
        result: T = await reply.future
        return result

    async def wait_until_idle(self) -> None:
        """Return once the engine holds no unfinished request."""
        reply = self._reply()
        if self._shared.submit(WaitIdle(reply)):
            await reply.future

    def start_draining(self) -> None:
        """Refuse new requests from now on (503) and report unhealthy; `shutdown` follows."""
        with self._shared.lock:
            self._shared.is_draining = True

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse new requests, let running ones finish for up to the timeout, abort the rest
        and stop the loop thread. Safe to call more than once."""
        self.start_draining()
        with self._shared.lock:
            first = not self._shutting_down
            self._shutting_down = True
        if first:
            idle = self._reply()
            if self._shared.submit(WaitIdle(idle)):
                try:
                    await asyncio.wait_for(asyncio.shield(idle.future), drain_timeout_s)
                except TimeoutError:
                    logger.warning(
                        "drain timed out after %.1fs; aborting the rest", drain_timeout_s
                    )
            stop = self._reply()
            if self._shared.submit(Stop(stop)):
                await stop.future
        await asyncio.to_thread(self._loop_thread.ended.wait)
        self._grammars.shutdown()

    # ---- the loop thread ----------------------------------------------------------------

    def run_loop(self) -> None:
        """The loop (blocks until `shutdown` stops it or it dies); called once, by the
        constructor's thread or, with `start_thread=False`, by the caller."""
        self._loop_thread.run()

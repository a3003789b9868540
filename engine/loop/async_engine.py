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
- `_streams` (request id -> stream) is shared by both sides under `_lock`; so are the state
  flags, which makes "check the state, then enqueue" atomic against the loop thread dying or
  stopping (a command enqueued afterwards would never be answered).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import traceback
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from engine.config import EngineConfig
from engine.errors import EngineError, EngineUnavailableError, InvalidRequestError
from engine.loop.commands import Abort, Add, Call, Command, Reply, Stop, WaitIdle
from engine.loop.request_stream import RequestStream, final_output
from engine.outputs import EngineStats, FinishReason, RequestOutput
from engine.request import EngineRequest, RequestId
from engine.step.threads import name_os_thread
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
        self._engine = engine
        self.config: EngineConfig = engine.config
        self.vocab_size: int = engine.vocab_size
        self.max_model_len: int = engine.max_model_len
        self.model_name: str = engine.model_name
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._streams: dict[RequestId, RequestStream] = {}
        # State flags, written under _lock.
        self._draining = False
        self._stopped = False
        self._dead = False
        self._shutting_down = False
        # Loop-thread only: requests inside the LLMEngine, and callers waiting for it to empty.
        self._admitted: set[RequestId] = set()
        self._idle_waiters: list[Reply] = []
        self._stats = engine.stats()  # replaced (never mutated) by the loop thread
        # Thread-safe on its own (engine/structured/compiler.py): used from the event loop.
        self._grammars = engine.grammars
        self._loop_ended = threading.Event()  # set when the loop returns, whatever the reason
        if start_thread:
            threading.Thread(
                target=self._run_loop_on_own_thread, name="engine-loop", daemon=True
            ).start()

    @classmethod
    def from_config(cls, config: EngineConfig, *, start_thread: bool = True) -> AsyncEngine:
        from engine.loop.llm_engine import LLMEngine

        return cls(LLMEngine(config), start_thread=start_thread)

    # ---- state --------------------------------------------------------------------------

    @property
    def is_healthy(self) -> bool:
        """The loop thread runs and accepts requests (False once dead, draining or stopped)."""
        with self._lock:
            accepting = not (self._dead or self._draining or self._stopped)
        return accepting and not self._loop_ended.is_set()

    @property
    def is_dead(self) -> bool:
        return self._dead

    @property
    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._streams)

    def stats(self) -> EngineStats:
        """The snapshot taken by the loop thread after its last step."""
        return self._stats

    def _unavailable(self) -> EngineUnavailableError | None:
        # Caller holds _lock.
        if self._dead:
            return EngineUnavailableError("the engine loop has stopped after an internal error")
        if self._stopped:
            return EngineUnavailableError("the engine has shut down")
        if self._draining:
            return EngineUnavailableError("the engine is shutting down")
        return None

    def _submit(self, command: Command) -> bool:
        """Enqueue for the loop thread; False once it has stopped or died (never answered)."""
        with self._lock:
            if self._dead or self._stopped:
                return False
            self._commands.put(command)
            return True

    def _reply(self) -> Reply:
        loop = asyncio.get_running_loop()
        return Reply(loop, loop.create_future())

    # ---- public API (event loop side) ---------------------------------------------------

    async def add_request(self, request: EngineRequest) -> RequestStream:
        """Admit a request; raises its EngineError (400/404/503) before anything streams."""
        spec = request.sampling_params.structured_outputs
        if spec is not None and request.grammar is None:
            with self._lock:  # nothing compiles for an engine that would refuse the request
                error = self._unavailable()
            if error is not None:
                raise error
            # compiled here, on the compiler's threads: the loop keeps stepping, and the
            # request holds no batch slot until its grammar is ready (or refused: a 400)
            request = replace(request, grammar=await self._grammars.compile_async(spec))
        stream = RequestStream(request, self._abandon)
        reply = self._reply()
        with self._lock:
            error = self._unavailable()
            if error is not None:
                raise error
            if request.request_id in self._streams:
                raise InvalidRequestError(
                    "request_id is already in use by a running request", param="request_id"
                )
            if len(self._streams) >= self.config.max_queue_len:
                raise EngineUnavailableError(
                    f"the engine is overloaded ({self.config.max_queue_len} requests in flight)"
                )
            self._streams[request.request_id] = stream
            self._commands.put(Add(stream, reply))
        try:
            await reply.future
        except BaseException:
            self._forget(stream)
            stream.closed = True
            if reply.future.cancelled():
                # The caller gave up while the loop thread may be admitting the request right
                # now; the abort is queued behind the add, so it cannot miss it.
                self._queue_abort(stream.request_id)
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
        if self._submit(Abort([RequestId(request_id) for request_id in request_ids], reply)):
            await reply.future

    def abort_nowait(self, request_id: str) -> None:
        """Queue an abort and return at once (safe in any `finally`); the request's stream
        still receives its final output (finish reason `abort`) if it is listening."""
        self._queue_abort(RequestId(request_id))

    async def run_in_loop(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(engine)` on the loop thread between steps (the engine is not thread-safe)."""
        reply = self._reply()
        if not self._submit(Call(fn, reply)):
            raise EngineUnavailableError("the engine loop is not running")
        result: T = await reply.future
        return result

    async def wait_until_idle(self) -> None:
        """Return once the engine holds no unfinished request."""
        reply = self._reply()
        if self._submit(WaitIdle(reply)):
            await reply.future

    def start_draining(self) -> None:
        """Refuse new requests from now on (503) and report unhealthy; `shutdown` follows."""
        with self._lock:
            self._draining = True

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse new requests, let running ones finish for up to the timeout, abort the rest
        and stop the loop thread. Safe to call more than once."""
        self.start_draining()
        with self._lock:
            first = not self._shutting_down
            self._shutting_down = True
        if first:
            idle = self._reply()
            if self._submit(WaitIdle(idle)):
                try:
                    await asyncio.wait_for(asyncio.shield(idle.future), drain_timeout_s)
                except TimeoutError:
                    logger.warning(
                        "drain timed out after %.1fs; aborting the rest", drain_timeout_s
                    )
            stop = self._reply()
            if self._submit(Stop(stop)):
                await stop.future
        await asyncio.to_thread(self._loop_ended.wait)
        self._grammars.shutdown()

    # ---- stream bookkeeping -------------------------------------------------------------

    def _forget(self, stream: RequestStream) -> bool:
        with self._lock:
            if self._streams.get(stream.request_id) is stream:
                del self._streams[stream.request_id]
                return True
        return False

    def _queue_abort(self, request_id: RequestId) -> None:
        with self._lock:
            if not (self._dead or self._stopped):
                self._commands.put(Abort([request_id], None))

    def _abandon(self, stream: RequestStream) -> None:
        if self._forget(stream):
            self._queue_abort(stream.request_id)

    # ---- the loop thread ----------------------------------------------------------------

    def _run_loop_on_own_thread(self) -> None:
        name_os_thread("engine-loop")
        self.run_loop()

    def run_loop(self) -> None:
        """The loop (blocks until `shutdown` stops it or it dies); called once, by the
        constructor's thread or, with `start_thread=False`, by the caller."""
        try:
            self._run()
        finally:
            self._loop_ended.set()

    def _run(self) -> None:
        engine = self._engine
        try:
            while True:
                for command in self._next_commands(block=not engine.has_unfinished_requests()):
                    if isinstance(command, Stop):
                        self._stop(command)
                        return
                    self._handle(command)
                if engine.has_unfinished_requests():
                    self._publish(engine.step())
                else:
                    self._stats = engine.stats()
                if self._idle_waiters and not engine.has_unfinished_requests():
                    for waiter in self._idle_waiters:
                        waiter.send()
                    self._idle_waiters.clear()
        except BaseException as exc:  # the loop must never die silently: fail every request
            self._die(exc)

    def _next_commands(self, *, block: bool) -> list[Command]:
        commands: list[Command] = []
        if block:
            try:
                commands.append(self._commands.get(timeout=self.config.idle_wait_s))
            except queue.Empty:
                return commands
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _handle(self, command: Command) -> None:
        engine = self._engine
        if isinstance(command, Add):
            self._admit(command)
        elif isinstance(command, Abort):
            self._publish(engine.abort_requests(command.request_ids))
            if command.reply is not None:
                command.reply.send()
        elif isinstance(command, Call):
            try:
                result = command.fn(engine)
            except Exception as exc:  # handed to the caller, who asked for this call
                command.reply.send(error=exc)
            else:
                command.reply.send(result)
        elif isinstance(command, WaitIdle):
            self._idle_waiters.append(command.reply)

    def _admit(self, command: Add) -> None:
        request = command.stream.request
        with self._lock:
            error = self._unavailable()
            wanted = self._streams.get(request.request_id) is command.stream
        if error is not None:
            command.reply.send(error=error)
            return
        if not wanted:  # the caller gave up before the add came through
            command.reply.send(error=EngineUnavailableError("the request was cancelled"))
            return
        try:
            self._engine.add_request(request)
        except EngineError as exc:
            command.reply.send(error=exc)
            return
        except Exception as exc:
            # A bug, not bad input: fail this request (500) and keep serving the others.
            logger.error("add_request failed with %s", type(exc).__name__)
            self._route(self._engine.abort_requests([request.request_id]))
            command.reply.send(error=EngineError("internal error while admitting the request"))
            return
        self._admitted.add(request.request_id)
        command.reply.send()

    def _publish(self, outputs: list[RequestOutput]) -> None:
        # Stats first: a caller that sees a request finish also sees it gone from the stats.
        self._stats = self._engine.stats()
        self._route(outputs)

    def _route(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            if output.finished:
                self._admitted.discard(output.request_id)
            with self._lock:
                stream = self._streams.get(output.request_id)
                if stream is not None and output.finished:
                    del self._streams[output.request_id]
            if stream is None:
                continue  # the consumer went away; its abort is queued
            if not stream.push_threadsafe(output) and not output.finished:
                # The consumer's event loop is gone: nobody will ever read or abort this one.
                self._forget(stream)
                self._route(self._engine.abort_requests([output.request_id]))

    def _end_all(self, reason: FinishReason, error: str | None = None) -> None:
        """Finish every stream still listening with a synthetic final output."""
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            stream.push_threadsafe(final_output(stream.request, reason, error))

    def _fail_pending(self, error: EngineUnavailableError) -> None:
        """Answer every command still queued (the state flags already refuse new ones)."""
        for command in self._next_commands(block=False):
            if isinstance(command, Add | Call):
                command.reply.send(error=error)
            elif command.reply is not None:
                command.reply.send()
        for waiter in self._idle_waiters:
            waiter.send()
        self._idle_waiters.clear()

    def _stop(self, command: Stop) -> None:
        with self._lock:
            self._stopped = True
        self._publish(self._engine.abort_requests(sorted(self._admitted)))
        self._end_all(FinishReason.ABORT)
        self._fail_pending(EngineUnavailableError("the engine has shut down"))
        command.reply.send()

    def _die(self, exc: BaseException) -> None:
        # The message may quote request data (token ids); log the type and the frames only.
        logger.error(
            "engine loop died with %s:\n%s",
            type(exc).__name__,
            "".join(traceback.format_tb(exc.__traceback__)),
        )
        with self._lock:
            self._dead = True
        self._end_all(FinishReason.ERROR, error=f"internal engine error ({type(exc).__name__})")
        self._fail_pending(EngineUnavailableError("the engine loop has stopped"))

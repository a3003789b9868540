"""The loop thread's side of the AsyncEngine: the one thread that touches the LLMEngine.

Apart from engine/loop/async_engine.py because the two sides never run on the same thread:
everything in `LoopThread` runs on the loop thread (its constructor aside), everything in
`AsyncEngine` on the callers' event loops. They meet only in `LoopShared`, under its lock, and
in the commands (engine/loop/commands.py) that carry each caller's `Reply` across.

The loop drains the command queue between steps, steps while there is work and idles on the
queue otherwise. It never dies silently: on any exception it marks itself dead, finishes every
stream with an error output and answers every queued command.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.errors import EngineError, EngineUnavailableError
from engine.loop.commands import Abort, Add, Call, Command, Reply, Stop, WaitIdle
from engine.loop.request_stream import RequestStream, final_output
from engine.outputs import FinishReason, RequestOutput
from engine.request import RequestId
from engine.step.threads import name_os_thread

if TYPE_CHECKING:
    from engine.loop.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class LoopShared:
    """What both sides share: the command queue, the streams (request id -> stream) and the
    state flags, the last two written under `lock`. Holding the lock makes "check the state,
    then enqueue" atomic against the loop thread dying or stopping (a command enqueued
    afterwards would never be answered)."""

    commands: queue.SimpleQueue[Command] = field(default_factory=queue.SimpleQueue)
    lock: threading.Lock = field(default_factory=threading.Lock)
    streams: dict[RequestId, RequestStream] = field(default_factory=dict)
    is_draining: bool = False
    is_stopped: bool = False
    is_dead: bool = False

    def unavailable(self) -> EngineUnavailableError | None:
        # Caller holds lock.
        if self.is_dead:
            return EngineUnavailableError("the engine loop has stopped after an internal error")
        if self.is_stopped:
            return EngineUnavailableError("the engine has shut down")
        if self.is_draining:
            return EngineUnavailableError("the engine is shutting down")
        return None

    def submit(self, command: Command) -> bool:
        """Enqueue for the loop thread; False once it has stopped or died (never answered)."""
        with self.lock:
            if self.is_dead or self.is_stopped:
                return False
            self.commands.put(command)
            return True

    def forget(self, stream: RequestStream) -> bool:
        with self.lock:
            if self.streams.get(stream.request_id) is stream:
                del self.streams[stream.request_id]
                return True
        return False

    def queue_abort(self, request_id: RequestId) -> None:
        with self.lock:
            if not (self.is_dead or self.is_stopped):
                self.commands.put(Abort([request_id], None))

    def abandon(self, stream: RequestStream) -> None:
        """A stream's consumer stopped listening before the request finished: abort it."""
        if self.forget(stream):
            self.queue_abort(stream.request_id)


class LoopThread:
    """Runs the loop over `engine`, talking to callers through `shared`; `run` is called once."""

    def __init__(self, engine: LLMEngine, shared: LoopShared) -> None:
        self._engine = engine
        self._shared = shared
        self._idle_wait_s = engine.config.idle_wait_s
        # Loop-thread only: requests inside the LLMEngine, and callers waiting for it to empty.
        self._admitted: set[RequestId] = set()
        self._idle_waiters: list[Reply] = []
        self.stats = engine.stats()  # replaced (never mutated) by the loop thread
        self.ended = threading.Event()  # set when the loop returns, whatever the reason

    def run_on_own_thread(self) -> None:
        name_os_thread("engine-loop")
        self.run()

    def run(self) -> None:
        """The loop (blocks until a Stop command ends it or it dies)."""
        try:
            self._run()
        finally:
            self.ended.set()

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
                    self.stats = engine.stats()
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
                commands.append(self._shared.commands.get(timeout=self._idle_wait_s))
            except queue.Empty:
                return commands
        while True:
            try:
                commands.append(self._shared.commands.get_nowait())
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
        with self._shared.lock:
            error = self._shared.unavailable()
            wanted = self._shared.streams.get(request.request_id) is command.stream
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
        self.stats = self._engine.stats()
        self._route(outputs)

    def _route(self, outputs: list[RequestOutput]) -> None:
        shared = self._shared
        for output in outputs:
            if output.finished:
                self._admitted.discard(output.request_id)
            with shared.lock:
                stream = shared.streams.get(output.request_id)
                if stream is not None and output.finished:
                    del shared.streams[output.request_id]
            if stream is None:
                continue  # the consumer went away; its abort is queued
            if not stream.push_threadsafe(output) and not output.finished:
                # The consumer's event loop is gone: nobody will ever read or abort this one.
                shared.forget(stream)
                self._route(self._engine.abort_requests([output.request_id]))

    def _end_all(self, reason: FinishReason, error: str | None = None) -> None:
        """Finish every stream still listening with a synthetic final output."""
        with self._shared.lock:
            streams = list(self._shared.streams.values())
            self._shared.streams.clear()
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
        with self._shared.lock:
            self._shared.is_stopped = True
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
        with self._shared.lock:
            self._shared.is_dead = True
        self._end_all(FinishReason.ERROR, error=f"internal engine error ({type(exc).__name__})")
        self._fail_pending(EngineUnavailableError("the engine loop has stopped"))

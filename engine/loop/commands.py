"""Commands from coroutines to the engine loop thread, and the reply path back to a future."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.loop.request_stream import RequestStream
from engine.request import RequestId

if TYPE_CHECKING:
    from engine.loop.llm_engine import LLMEngine


@dataclass
class Reply:
    """Where the loop thread sends one command's result: a future on the caller's loop."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]

    def send(self, result: Any = None, error: BaseException | None = None) -> None:
        def resolve() -> None:
            if self.future.done():  # the caller was cancelled meanwhile
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        # A closed event loop raises RuntimeError: nobody is waiting for this answer any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(resolve)


@dataclass
class Add:
    stream: RequestStream
    reply: Reply


@dataclass
class Abort:
    request_ids: list[RequestId]
    reply: Reply | None


@dataclass
class Call:
    fn: Callable[[LLMEngine], Any]
    reply: Reply


@dataclass
class WaitIdle:
    reply: Reply


@dataclass
class Stop:
    reply: Reply


Command = Add | Abort | Call | WaitIdle | Stop

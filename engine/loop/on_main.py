"""`loragate engine`'s process layout: the engine loop on the main thread, the server on another.

Why: torch's OpenMP work runs slower when a non-main thread drives it. On the 2-core bench box
a decode step took 19-21 ms stepped from the main thread and 25-28 ms from any other
(bench/step_thread.py), and the HTTP engine's inter-token latency is that step. The event loop
(uvicorn, the SSE writes) is the light side, so it moves instead.

Python runs signal handlers on the main thread only, and uvicorn off the main thread listens
for none, so SIGINT/SIGTERM are taken here and handed to the server, which drains as before (its
lifespan shuts the engine down, and that ends the loop).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Protocol

from engine.loop.async_engine import AsyncEngine
from engine.step.threads import name_os_thread

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SignalHandler = Callable[[int, FrameType | None], None]
# uvicorn's exit status when the server could not start (the port taken, say).
STARTUP_FAILURE = 3


class Server(Protocol):
    """What of `uvicorn.Server` this module uses (engine/ leaves uvicorn to engine.server)."""

    started: bool

    def run(self) -> None: ...


def run_loop_beside_server(
    engine: AsyncEngine, run_server: Callable[[], None], on_signal: SignalHandler
) -> list[int]:
    """Run `run_server` on a thread of its own and the engine's loop on this one (the main
    thread; the engine must not have started a thread). Blocks until both have ended and
    returns the signals received, in order."""
    received: list[int] = []

    def take(sig: int, frame: FrameType | None) -> None:
        received.append(sig)
        on_signal(sig, frame)

    def server_thread() -> None:
        name_os_thread("http")
        try:
            run_server()
        finally:
            # The server is gone (drained, or it never started): the loop must not outlive it.
            # After the lifespan's own shutdown this returns at once.
            asyncio.run(engine.shutdown(drain_timeout_s=0))

    originals = {sig: signal.signal(sig, take) for sig in HANDLED_SIGNALS}
    server = threading.Thread(target=server_thread, name="http")
    server.start()
    try:
        engine.run_loop()
        server.join()  # the loop may end first (it died): keep serving its 503s until told
    finally:
        for sig, handler in originals.items():
            signal.signal(sig, handler)
    return received


def serve_beside_loop(engine: AsyncEngine, server: Server, on_signal: SignalHandler) -> None:
    """`run_loop_beside_server` for a uvicorn server, ending as `uvicorn.run` would: exit
    STARTUP_FAILURE if it never started, else re-raise the signals that stopped it, so the
    process ends the way a process given that signal ends."""
    received = run_loop_beside_server(engine, server.run, on_signal)
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)
    for sig in reversed(received):
        signal.raise_signal(sig)

"""What the gateway needs from an engine, whichever kind serves it (in-process or HTTP).

Both clients speak the tokens-only wire schema (engine.protocol): a `GenerateRequest` goes in,
and a stream of `GenerateResponse` events comes out, each carrying the new token ids of its
choices, the last one carrying `usage`. Errors before the first event are gateway errors with
their HTTP status (400, 404, 503, 500/502); a failure after it is an `EngineStreamError`.

Ending a request early has two steps, so the ledger counts exactly what the engine produced:
`abort()` asks the engine to stop and the stream goes on to the engine's last event (finish
reason `abort`, then `usage`); `aclose()` stops listening, at once, whatever is left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from engine.protocol import GenerateRequest, GenerateResponse, StructuredSpec
from gateway.policy import AdapterRef


class EngineStreamError(Exception):
    """The engine failed after the stream started (a replica died, an engine error event)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EngineStream(Protocol):
    def __aiter__(self) -> AsyncIterator[GenerateResponse]: ...

    def abort(self) -> None:
        """Ask the engine to stop this request; the stream then ends with its final events.
        Synchronous (callable from any exit path) and idempotent; never raises."""
        ...

    async def aclose(self) -> None:
        """Stop listening; an unfinished request is aborted on its engine. Idempotent."""
        ...


class EngineClient(Protocol):
    model_name: str
    max_model_len: int
    vocab_size: int

    async def start(self) -> None: ...

    async def open(
        self, request: GenerateRequest, adapter: AdapterRef | None, traceparent: str | None = None
    ) -> EngineStream:
        """Submit the request (loading `adapter` where it runs, if needed). `traceparent`: the
        gateway's engine-call span (None: tracing is off), sent as the W3C header, so the
        engine's spans join the request's trace (gateway/telemetry/tracing.py)."""
        ...

    async def check_constraint(self, spec: StructuredSpec) -> None:
        """Validate an output constraint in full before admission; raises the engine's
        InvalidRequestError naming the field. In process this is the engine's own compile
        (cached for the request that follows; the engine yields a core to it); in front of
        HTTP engines, llguidance's validation on a worker thread of the gateway."""
        ...

    def start_unload(self, engine_name: str) -> None:
        """Drop the adapter from every engine that holds it (its files are gone): new requests
        for it are refused there at once, running ones finish first, in the background."""
        ...

    async def check_ready(self) -> dict[str, bool]:
        """Readiness per engine (or replica)."""
        ...

    async def close(self) -> None: ...

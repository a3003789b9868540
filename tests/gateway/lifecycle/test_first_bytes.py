"""A streamed run hands its first bytes to the responder before it works through the events
behind them (gateway/lifecycle/run.py `_hand_over`): an engine's events can arrive in one read,
and each one decoded first would delay the client's first byte. Plain asyncio, no model: the
engine stream yields a burst without suspending, as a buffered HTTP response does."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator

from engine.protocol import (
    GenerateChoice,
    GenerateRequest,
    GenerateResponse,
    GenerateSamplingParams,
)
from gateway.lifecycle.job import EngineTarget, Plan
from gateway.lifecycle.run import Run
from gateway.policy import ResolvedModel, TenantContext
from tenancy.ids import ApiKeyId, TenantId
from tenancy.quota.memory_store import InProcessQuotaStore

BURST = 20


class CountingOutput:
    """Counts what the run decoded; every event is one SSE event."""

    def __init__(self) -> None:
        self.num_fed = 0
        self.num_completion_tokens = 0
        self.num_cached_tokens = 0
        self.finish_reason = "length"
        self.is_done = False

    def feed(self, prompt: int, event: GenerateResponse) -> bytes:
        self.num_fed += 1
        self.num_completion_tokens += 1
        return b"data: %d\n\n" % self.num_fed

    def is_prompt_done(self, prompt: int) -> bool:
        return False

    def end(self, reason: str) -> bytes:
        return b""

    def head(self) -> bytes:
        return b""

    def tail(self) -> bytes:
        return b"data: [DONE]\n\n"

    def failure(self, message: str) -> bytes:
        return b""

    def body(self) -> bytes:
        return b""


class BurstStream:
    def __init__(self) -> None:
        self.num_aborts = 0

    async def _events(self) -> AsyncIterator[GenerateResponse]:
        for i in range(BURST):  # no await between events: all were in one read
            yield GenerateResponse(request_id="r", choices=[GenerateChoice(index=0, token_ids=[i])])

    def __aiter__(self) -> AsyncIterator[GenerateResponse]:
        return self._events()

    def abort(self) -> None:
        self.num_aborts += 1

    async def aclose(self) -> None:
        return None


class BurstEngine:
    async def open(
        self, request: object, adapter: object, traceparent: object = None
    ) -> BurstStream:
        return BurstStream()


class Books:
    def __init__(self) -> None:
        self.num_finished = 0

    async def finish(self, run: Run) -> None:
        self.num_finished += 1


def _run(output: CountingOutput, books: Books) -> Run:
    ctx = TenantContext(tenant_id=TenantId("t"), key_id=ApiKeyId("k"), tier="standard", salt="s")
    request = GenerateRequest(
        request_id="r",
        token_ids=[1, 2, 3],
        sampling_params=GenerateSamplingParams(max_tokens=BURST),
    )
    return Run(
        EngineTarget("r", ctx, ResolvedModel(name="tiny", adapter=None), priority=10),
        Plan(requests=[request], reserve_tokens=3 + BURST, output=output),
        stream=True, started=0.0, started_at=dt.datetime.now(dt.UTC),
        engine=BurstEngine(),  # type: ignore[arg-type]
        quotas=InProcessQuotaStore(lease_ttl_s=30), subjects=[],
        books=books,  # type: ignore[arg-type]
        abort_timeout_s=1.0,
    )  # fmt: skip


async def test_the_first_bytes_go_out_before_the_rest_of_a_burst_is_decoded() -> None:
    output, books = CountingOutput(), Books()
    run = _run(output, books)
    run.start()
    first = await asyncio.wait_for(run.answer, 5)
    decoded_when_answered = output.num_fed
    run.first_sent()  # what EventStreamResponse does once the first bytes are sent
    rest = []
    while (chunk := await asyncio.wait_for(run.events.get(), 5)) is not None:
        rest.append(chunk)
    await asyncio.wait_for(run.wait(), 5)
    assert first == b"data: 1\n\n" and decoded_when_answered == 1
    assert b"".join(rest).count(b"data: ") == BURST  # 19 events and [DONE]
    assert books.num_finished == 1


async def test_a_responder_that_never_sends_holds_the_run_only_briefly() -> None:
    """The client left between the answer and the first send: client_gone releases the run."""
    output, books = CountingOutput(), Books()
    run = _run(output, books)
    run.start()
    await asyncio.wait_for(run.answer, 5)
    run.client_gone()
    await asyncio.wait_for(run.wait(), 5)
    assert books.num_finished == 1

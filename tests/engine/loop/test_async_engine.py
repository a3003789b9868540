"""AsyncEngine over the real LLMEngine on the tiny model: admission, abort, overload, drain."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.errors import AdapterNotFoundError, EngineUnavailableError, InvalidRequestError
from engine.loop.async_engine import AsyncEngine, RequestStream
from engine.loop.llm_engine import LLMEngine
from engine.outputs import FinishReason, RequestOutput
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams
from tests.engine.loop.async_helpers import TIMEOUT_S, assert_idle_and_consistent, shut_down_checked

QUEUE_LEN = 16
_ids = itertools.count()


def make_request(
    max_tokens: int = 8, *, n: int = 1, prompt: tuple[int, ...] = (1, 2, 3, 4, 5), **fields
) -> EngineRequest:
    params = SamplingParams(n=n, temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return EngineRequest(
        request_id=RequestId(f"req-{next(_ids)}"),
        prompt_token_ids=prompt,
        sampling_params=params,
        **fields,
    )


def long_request(**fields) -> EngineRequest:
    """Runs for hundreds of steps: still running whenever a test acts on it."""
    return make_request(max_tokens=1500, **fields)


@pytest.fixture(scope="module")
def llm_engine(tiny_model_dir: Path) -> Iterator[LLMEngine]:
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_model_dir), num_kv_blocks=256, max_num_seqs=8, max_queue_len=QUEUE_LEN
        )
    )
    yield engine
    engine.check_invariants()


@pytest.fixture
async def engine(llm_engine: LLMEngine) -> AsyncIterator[AsyncEngine]:
    async_engine = AsyncEngine(llm_engine)
    yield async_engine
    await shut_down_checked(async_engine, llm_engine)


async def drain(stream: RequestStream | AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    async def collect() -> list[RequestOutput]:
        return [output async for output in stream]

    return await asyncio.wait_for(collect(), TIMEOUT_S)


def tokens_by_choice(outputs: list[RequestOutput]) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = {}
    for output in outputs:
        for choice in output.choices:
            tokens.setdefault(choice.index, []).extend(choice.token_ids)
    return tokens


def finishes(outputs: list[RequestOutput]) -> dict[int, FinishReason]:
    return {
        choice.index: choice.finish_reason
        for output in outputs
        for choice in output.choices
        if choice.finish_reason is not None
    }


async def test_generate_streams_deltas_to_the_end(engine: AsyncEngine):
    before = engine.stats().generation_tokens_total
    outputs = await drain(await engine.generate(make_request(max_tokens=8, n=2)))
    assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
    assert {i: len(t) for i, t in tokens_by_choice(outputs).items()} == {0: 8, 1: 8}
    assert finishes(outputs) == {0: FinishReason.LENGTH, 1: FinishReason.LENGTH}
    # The stats snapshot already counts the finished request when its last output arrives.
    assert engine.stats().generation_tokens_total - before == 16
    await assert_idle_and_consistent(engine)


async def test_invalid_requests_raise_before_streaming_and_leave_the_engine_serving(
    engine: AsyncEngine,
):
    with pytest.raises(InvalidRequestError) as info:
        await engine.add_request(make_request(prompt=(1, engine.vocab_size)))
    assert info.value.param == "token_ids"
    with pytest.raises(AdapterNotFoundError):
        await engine.add_request(make_request(adapter_name="no-such-adapter"))
    assert await engine.run_in_loop(lambda e: e.num_unfinished_requests()) == 0
    assert engine.num_in_flight == 0
    outputs = await drain(await engine.add_request(make_request(max_tokens=3)))
    assert tokens_by_choice(outputs)[0] and outputs[-1].finished


async def test_duplicate_request_id_is_refused_while_running(engine: AsyncEngine):
    request = long_request()
    stream = await engine.add_request(request)
    with pytest.raises(InvalidRequestError) as info:
        await engine.add_request(replace(request, sampling_params=SamplingParams(max_tokens=2)))
    assert info.value.param == "request_id"
    stream.close()
    await assert_idle_and_consistent(engine)


async def test_closing_the_stream_early_aborts_the_request(engine: AsyncEngine):
    before = engine.stats().generation_tokens_total
    outputs = await engine.generate(long_request())
    first = await asyncio.wait_for(anext(outputs), TIMEOUT_S)
    assert not first.finished
    await outputs.aclose()  # what the server does when the client disconnects
    await assert_idle_and_consistent(engine)
    assert engine.stats().generation_tokens_total - before < 1500


async def test_cancelling_the_consumer_aborts_the_request(engine: AsyncEngine):
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in await engine.generate(long_request()):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), TIMEOUT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await assert_idle_and_consistent(engine)


async def test_abort_ends_every_choice_with_abort(engine: AsyncEngine):
    request = long_request(n=2)
    stream = await engine.add_request(request)
    first = await asyncio.wait_for(anext(stream), TIMEOUT_S)
    await engine.abort([request.request_id, "unknown-id"])
    outputs = [first, *await drain(stream)]
    assert outputs[-1].finished
    assert finishes(outputs) == {0: FinishReason.ABORT, 1: FinishReason.ABORT}
    await assert_idle_and_consistent(engine)


async def test_overload_past_the_queue_limit_is_503(engine: AsyncEngine):
    assert engine.config.max_queue_len == QUEUE_LEN
    streams = [await engine.add_request(long_request()) for _ in range(QUEUE_LEN)]
    with pytest.raises(EngineUnavailableError) as info:
        await engine.add_request(make_request())
    assert info.value.status_code == 503
    assert engine.is_healthy  # overload is not sickness
    for stream in streams:
        stream.close()
    await assert_idle_and_consistent(engine)
    outputs = await drain(await engine.add_request(make_request(max_tokens=2)))
    assert outputs[-1].finished


async def test_many_consumers_cancelled_at_every_stage_free_everything(engine: AsyncEngine):
    """Cancelled while admitting, waiting, prefilling or decoding: nothing may leak."""
    progressed = [asyncio.Event() for _ in range(QUEUE_LEN)]

    async def consume(index: int) -> None:
        async for _ in await engine.generate(long_request(prompt=tuple(range(1, 40 + index)))):
            progressed[index].set()

    tasks = [asyncio.create_task(consume(i)) for i in range(QUEUE_LEN)]
    await asyncio.sleep(0)  # let them start their admission, not finish it
    tasks[0].cancel()  # most likely still waiting to be admitted
    await asyncio.wait_for(progressed[1].wait(), TIMEOUT_S)
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(result, asyncio.CancelledError) for result in results)
    await assert_idle_and_consistent(engine)


async def test_drain_lets_running_requests_finish_and_refuses_new_ones(engine: AsyncEngine):
    stream = await engine.add_request(make_request(max_tokens=40))
    engine.start_draining()
    assert not engine.is_healthy
    with pytest.raises(EngineUnavailableError):
        await engine.add_request(make_request())
    shutdown = asyncio.create_task(engine.shutdown(drain_timeout_s=TIMEOUT_S))
    outputs = await drain(stream)
    await asyncio.wait_for(shutdown, TIMEOUT_S)
    assert finishes(outputs) == {0: FinishReason.LENGTH}
    assert len(tokens_by_choice(outputs)[0]) == 40
    assert not engine.is_healthy


async def test_drain_timeout_aborts_the_rest(engine: AsyncEngine):
    stream = await engine.add_request(long_request())
    await asyncio.wait_for(engine.shutdown(drain_timeout_s=0.05), TIMEOUT_S)
    outputs = await drain(stream)
    assert outputs[-1].finished
    assert finishes(outputs) == {0: FinishReason.ABORT}
    assert len(tokens_by_choice(outputs).get(0, [])) < 1500
    with pytest.raises(EngineUnavailableError):
        await engine.add_request(make_request())


async def test_run_in_loop_hands_back_errors_and_keeps_serving(engine: AsyncEngine):
    def boom(_: LLMEngine) -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await engine.run_in_loop(boom)
    assert engine.is_healthy
    assert await engine.run_in_loop(lambda e: e.vocab_size) == engine.vocab_size


async def test_a_dead_loop_fails_every_request_and_turns_unhealthy(
    engine: AsyncEngine, llm_engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
):
    request = long_request(n=2)
    stream = await engine.add_request(request)
    first = await asyncio.wait_for(anext(stream), TIMEOUT_S)

    # Fault injection on the real engine: its next step fails as a CUDA or kernel error would.
    def failing_step() -> list[RequestOutput]:
        raise RuntimeError("injected step failure")

    monkeypatch.setattr(llm_engine, "step", failing_step)
    outputs = [first, *await drain(stream)]
    assert outputs[-1].finished and outputs[-1].error is not None
    assert "injected" not in outputs[-1].error  # the message may hold request data
    assert finishes(outputs) == {0: FinishReason.ERROR, 1: FinishReason.ERROR}
    assert engine.is_dead and not engine.is_healthy
    with pytest.raises(EngineUnavailableError):
        await engine.add_request(make_request())
    await asyncio.wait_for(engine.shutdown(), TIMEOUT_S)
    # The loop thread is gone: clean the LLMEngine up for the next test on this thread.
    monkeypatch.undo()
    llm_engine.abort_requests([request.request_id])

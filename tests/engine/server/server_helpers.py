"""What the engine-server tests share: the request body, SSE parsing, the untouched-engine
check, waiting for a state, metric samples, fault injection. The fixtures (the engine on the
tiny model, an ASGI client, a live uvicorn) are in this directory's conftest.py; the idle check
and the checked shutdown, shared with tests/engine/loop/test_async_engine.py, in
tests/engine/loop/async_helpers.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.loop.async_engine import AsyncEngine
from engine.loop.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from tests.engine.loop.async_helpers import TIMEOUT_S

GENERATE = "/inference/v1/generate"
LONG = 1500  # max_tokens of a request that is still running whenever a test acts on it


def gen_body(max_tokens: int = 6, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "token_ids": [1, 2, 3, 4, 5],
        "sampling_params": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True},
    }
    sampling = fields.pop("sampling_params", {})
    body["sampling_params"].update(sampling)
    body.update(fields)
    return body


def parse_sse(text: str) -> list[Any]:
    """The events of a complete SSE body; asserts the framing on the way."""
    assert text.endswith("\n\n")
    events = []
    for block in text[:-2].split("\n\n"):
        assert block.startswith("data: "), block
        assert "\n" not in block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def read_events(response: httpx.Response) -> AsyncIterator[Any]:
    async for line in response.aiter_lines():
        if not line:
            continue
        assert line.startswith("data: ")
        payload = line[len("data: ") :]
        yield payload if payload == "[DONE]" else json.loads(payload)


async def engine_untouched(engine: AsyncEngine) -> None:
    assert await engine.run_in_loop(lambda e: e.num_unfinished_requests()) == 0
    assert engine.num_in_flight == 0


async def wait_until(predicate: Callable[[], bool]) -> None:
    """For states no event announces (a request admitted on the far side of HTTP)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def metric_samples(text: str) -> dict[str, list[Any]]:
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def break_the_loop(llm_engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection on the real engine: its next step fails like a kernel or CUDA error."""

    def failing_step() -> list[RequestOutput]:
        raise RuntimeError("injected step failure")

    monkeypatch.setattr(llm_engine, "step", failing_step)

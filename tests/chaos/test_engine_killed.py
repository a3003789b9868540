"""Acceptance 3: an engine replica killed (SIGKILL) mid-stream, in HTTP engine mode.

One gateway process over two `loragate engine` servers. Eight long streams run, spread over
both engines; once each has received some text, one engine is killed. The streams it served end
with an error event and `data: [DONE]` (never a cut connection); the others finish with
finish reason `length`. Every request has exactly one usage row: finish reason `error` and the
tokens produced so far for the affected ones, `length` and the full count for the others.
New requests then go to the surviving engine, every lease is settled, and the gateway's log
holds no traceback (the killed engine's own log is not looked at).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest
from deployment import Deployment
from engine_processes import EngineProcess

pytestmark = pytest.mark.asyncio

NUM_STREAMS = 8
MAX_TOKENS = 1500
CHUNKS_BEFORE_KILL = 3
RUNNING = "vllm:num_requests_running"
SERVED = "vllm:request_success_total"


@dataclass
class Stream:
    """What one streaming client saw, line by line."""

    index: int
    status: int | None = None
    lines: list[str] = field(default_factory=list)  # every `data: ` line, in order
    text_chunks: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)  # CHUNKS_BEFORE_KILL arrived

    @property
    def events(self) -> list[dict]:
        return [json.loads(line[6:]) for line in self.lines if line.startswith("data: {")]

    @property
    def request_id(self) -> str:
        return next(e["id"] for e in self.events if "id" in e)

    @property
    def failed(self) -> bool:
        return any("error" in e for e in self.events)


@pytest.fixture
def dep(over_two_engines: Callable[[int], Deployment]) -> Deployment:
    return over_two_engines(1)


def _body(content: str, **fields: object) -> dict:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        **fields,
    }


async def _read(client: httpx.AsyncClient, key: str, s: Stream) -> None:
    body = _body(
        f"A very long story, number {s.index}.",
        max_tokens=MAX_TOKENS,
        ignore_eos=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    headers = {"authorization": f"Bearer {key}"}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        s.status = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue  # blank separators and keep-alive comments
            s.lines.append(line)
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                if event.get("choices") and event["choices"][0]["delta"].get("content"):
                    s.text_chunks += 1
                    if s.text_chunks >= CHUNKS_BEFORE_KILL:
                        s.started.set()
    s.started.set()  # ended early (asserted below): the test must not hang on it


async def test_engine_killed_mid_stream(dep: Deployment, two_engines: list[EngineProcess]) -> None:
    tenant = dep.tenant(
        max_concurrent=100,
        requests_per_minute=10_000,
        tokens_per_minute=100_000_000,
        daily_token_budget=1_000_000_000,
        monthly_token_budget=1_000_000_000,
    )
    streams = [Stream(i) for i in range(NUM_STREAMS)]
    async with httpx.AsyncClient(base_url=dep.gateway.url, timeout=120) as client:
        readers = [asyncio.create_task(_read(client, tenant.key, s)) for s in streams]
        await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in streams)), 120)
        assert all(s.text_chunks >= CHUNKS_BEFORE_KILL for s in streams), [
            (s.status, s.lines[-3:]) for s in streams
        ]
        # Both engines serve some of the streams (the gateway routes by least outstanding).
        running = [await asyncio.to_thread(e.metric, RUNNING) for e in two_engines]
        assert sum(running) == NUM_STREAMS and min(running) >= 1, running
        victim, survivor = two_engines[0], two_engines[1]
        on_victim = int(running[0])
        victim.kill()
        await asyncio.wait_for(asyncio.gather(*readers), 300)

        assert all(s.status == 200 for s in streams)
        failed = [s for s in streams if s.failed]
        finished = [s for s in streams if not s.failed]
        assert len(failed) == on_victim, [s.lines[-2:] for s in streams]
        # The affected streams: their text so far, then an error event, then [DONE].
        for s in failed:
            assert s.lines[-1] == "data: [DONE]", s.lines[-3:]
            error = json.loads(s.lines[-2][6:])
            assert error["error"]["type"] == "server_error", error
            assert sum("error" in e for e in s.events) == 1, s.lines[-3:]
            assert CHUNKS_BEFORE_KILL <= s.text_chunks < MAX_TOKENS
        # The others finish normally, with their usage.
        for s in finished:
            assert s.lines[-1] == "data: [DONE]", s.lines[-3:]
            events = s.events
            assert events[-1]["usage"]["completion_tokens"] == MAX_TOKENS, events[-1]
            reasons = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")]
            assert reasons[-1] == "length" and set(reasons[:-1]) == {None}, reasons[-3:]

        # ---- the ledger: one row per request, as its client saw it ------------------------------
        rows = await dep.wait_rows(tenant.tenant_id, NUM_STREAMS)
        by_id = {r.request_id: r for r in rows}
        assert len(rows) == NUM_STREAMS and len(by_id) == NUM_STREAMS
        assert set(by_id) == {s.request_id for s in streams}
        for s in failed:
            row = by_id[s.request_id]
            assert row.finish_reason == "error"
            assert s.text_chunks <= row.completion_tokens < MAX_TOKENS, row.completion_tokens
        for s in finished:
            row = by_id[s.request_id]
            assert (row.finish_reason, row.completion_tokens) == ("length", MAX_TOKENS)
        print(
            f"running={running} failed={len(failed)} finished={len(finished)} "
            f"failed_rows={[(by_id[s.request_id].completion_tokens, s.text_chunks) for s in failed]}"
        )

        # ---- new requests go to the surviving engine -------------------------------------------
        before = survivor.metric(SERVED)
        for _ in range(4):
            r = await client.post(
                "/v1/chat/completions",
                headers={"authorization": f"Bearer {tenant.key}"},
                json=_body("Still there?", max_tokens=5, ignore_eos=True),
            )
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 5
        assert survivor.metric(SERVED) - before == 4
        ready = await client.get("/ready")
        assert ready.status_code == 200, ready.text  # one engine is enough to serve
        assert sorted(ready.json()["engines"].values()) == [False, True]

    rows = await dep.wait_rows(tenant.tenant_id, NUM_STREAMS + 4)
    assert len(rows) == NUM_STREAMS + 4
    # Settlement follows each answer: give the last one a moment (not a timing assertion).
    deadline = time.monotonic() + 10
    while (
        leases := (await dep.quota(tenant.tenant_id)).num_leases
    ) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert leases == 0
    assert dep.noisy_logs() == []
    # One WARNING names the failed replica (by index, never its URL); no traceback.
    log = dep.gateway.log_text()
    assert "failed; marked unhealthy" in log
    assert not any(e.url in log for e in dep.engines)

"""Shutdown flushes the usage ledger; include_stop_str_in_output; several prompts in one
completions request stream as one response with one usage record."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gateway_harness import MODEL, SecretScan, gateway_settings, running_gateway
from sqlalchemy import func, select

from tenancy.sql.models import UsageRecord
from tenancy.sql.session import make_engine, make_sessionmaker


async def test_shutdown_flushes_the_usage_ledger_and_output_options(
    tiny_model_dir: Path, tmp_path: Path, secret_scan: SecretScan
) -> None:
    # A flush interval far longer than the test: only the shutdown flush can write the records.
    settings = gateway_settings(tiny_model_dir, tmp_path, usage_flush_interval_s=3600)
    async with running_gateway(settings, secret_scan) as gw:
        tenant = await gw.tenant()
        body = gw.chat_body("Count to ten, please.", max_tokens=30, ignore_eos=True)
        first = await gw.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
        text = first.json()["choices"][0]["message"]["content"]
        stop = text[5:8]
        cut = text.index(stop)
        for include, expected in ((False, text[:cut]), (True, text[: cut + len(stop)])):
            r = await gw.client.post(
                "/v1/chat/completions",
                headers=tenant.headers,
                json={**body, "stop": stop, "include_stop_str_in_output": include},
            )
            assert r.json()["choices"][0]["message"]["content"] == expected
        # Two prompts, n=2, streamed: choices 0-3 in one stream, one usage chunk, one record.
        streamed = await gw.client.post(
            "/v1/completions",
            headers=tenant.headers,
            json={"model": MODEL, "prompt": ["Once upon", "In a galaxy"], "n": 2, "max_tokens": 5,
                  "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}},
        )  # fmt: skip
        events = [
            json.loads(line[6:])
            for line in streamed.text.splitlines()
            if line.startswith("data: {")
        ]
        finished = {c["index"] for e in events for c in e["choices"] if c["finish_reason"]}
        assert finished == {0, 1, 2, 3}
        assert events[-1]["usage"]["completion_tokens"] == 20
        # Each run records once its engine streams have ended, just after its answer.
        deadline = asyncio.get_running_loop().time() + 10
        while gw.state.usage.num_pending < 4:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        assert gw.state.usage.num_pending == 4  # nothing written yet
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            count = await session.scalar(
                select(func.count(UsageRecord.id)).where(UsageRecord.tenant_id == tenant.tenant_id)
            )
    finally:
        await engine.dispose()
    assert count == 4


async def test_draining_refuses_new_requests_and_lets_those_in_flight_finish(
    tiny_model_dir: Path, tmp_path: Path, secret_scan: SecretScan
) -> None:
    settings = gateway_settings(tiny_model_dir, tmp_path)
    async with running_gateway(settings, secret_scan) as gw:
        tenant = await gw.tenant()
        body = gw.chat_body("Finish what you started.", max_tokens=40, ignore_eos=True)
        in_flight = asyncio.create_task(
            gw.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
        )
        while gw.state.lifecycle.num_in_flight == 0:
            await asyncio.sleep(0.005)
        drained = gw.state.lifecycle.begin_drain(30.0)
        refused = await gw.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        assert refused.headers["retry-after"] == "1"
        done = await in_flight
        assert done.status_code == 200
        assert done.json()["choices"][0]["finish_reason"] == "length"
        await drained  # returns once the run has settled and recorded
        records = await gw.usage_records(tenant)
        assert [r.finish_reason for r in records] == ["length"]

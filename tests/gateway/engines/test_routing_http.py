"""Cache-aware routing over two real engine servers (HTTP mode): a conversation's later turns go
to the replica that served its first, that engine serves them from its prefix cache exactly as
much as the gateway expected, and /metrics and the engines' status say so per replica."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from engine_processes import EngineProcess, start_engines
from gateway_harness import Gateway, SecretScan, gateway_settings
from live_server import live_gateway
from prometheus_client.parser import text_string_to_metric_families

from gateway.engines.status import engine_status

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK = 16


@pytest.fixture(scope="module")
def engines(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[EngineProcess]]:
    procs = start_engines(tiny_model_dir, tmp_path_factory.mktemp("engines"), 2)
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    engines: list[EngineProcess],
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    secret_scan: SecretScan,
) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        tiny_model_dir,
        tmp_path_factory.mktemp("routing"),
        engine_mode="http",
        engine_urls=[e.url for e in engines],
        engine_poll_interval_s=0.3,
    )
    async with live_gateway(settings) as (url, state):  # noqa: SIM117 (url comes from it)
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            yield Gateway(state=state, client=client, scan=secret_scan)


def _served(engine: EngineProcess) -> float:
    return engine.metric("vllm:request_success_total")


def _gateway_metric(text: str, name: str, replica: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("replica") == replica:
                return sample.value
    return 0.0


async def test_a_conversation_stays_on_its_replica_and_hits_its_cache(
    gw: Gateway, engines: list[EngineProcess]
) -> None:
    tenant = await gw.tenant()
    prompt = list(range(100, 100 + 3 * BLOCK + 5))  # three full blocks and a bit
    before = [_served(e) for e in engines]
    cached = []
    for turn in range(4):
        body = {"model": gw.state.settings.model_name, "prompt": prompt, "max_tokens": 2,
                "temperature": 0}  # fmt: skip
        r = await gw.client.post("/v1/completions", headers=tenant.headers, json=body)
        assert r.status_code == 200, r.text
        cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        prompt = [*prompt, *range(200 + turn * 20, 220 + turn * 20)]  # the next turn appends
    served = [_served(e) - b for e, b in zip(engines, before, strict=True)]
    assert sorted(served) == [0, 4]  # every turn on one replica
    # each later turn finds the previous prompt's full blocks (the last token is recomputed)
    assert cached[0] == 0 and all(c >= 3 * BLOCK for c in cached[1:])
    home = f"engine-{served.index(4)}"
    text = (await gw.client.get("/metrics")).text
    expected = _gateway_metric(text, "loragate_gateway_engine_expected_cached_tokens_total", home)
    reported = _gateway_metric(text, "loragate_gateway_engine_cached_tokens_total", home)
    assert reported == sum(cached) and expected == sum(cached)
    prefix = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "loragate_gateway_engine_requests_total"
        and s.labels == {"replica": home, "route": "prefix"}
    ]
    assert prefix == [3.0]
    status = {s.name: s for s in await engine_status(gw.state.engine)}
    assert status[home].num_routed == 4
    assert status[home].hit_rate == status[home].expected_hit_rate
    assert status[home].hit_rate is not None and status[home].hit_rate > 0.5

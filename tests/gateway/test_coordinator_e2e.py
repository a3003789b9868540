"""Acceptance 2-5 through the real app and the real in-process engine on the tiny model:
tokens-only pass-through parity, stop strings across tokens, cache salting, priority tiers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gateway_harness import MODEL, Gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = "Write a short story about a lighthouse keeper who finds a map in a bottle."


async def _chat(gw: Gateway, key: Any, **fields: Any) -> dict[str, Any]:
    r = await gw.client.post(
        "/v1/chat/completions", headers=key.headers, json=gw.chat_body(PROMPT, **fields)
    )
    assert r.status_code == 200, r.text
    return r.json()


async def _engine_idle(gw: Gateway) -> int:
    engine = gw.state.engine.engine  # type: ignore[attr-defined]
    return await engine.run_in_loop(lambda e: e.num_unfinished_requests())


async def test_tokenize_generate_detokenize_equals_chat(gateway: Gateway) -> None:
    """Acceptance 2: the same greedy request two ways gives exactly the same text."""
    tenant = await gateway.tenant()
    chat = await _chat(gateway, tenant, max_tokens=40, ignore_eos=True)
    tok = gateway.state.tokenizer
    token_ids = tok.encode_chat([{"role": "user", "content": PROMPT}])
    body = {"token_ids": token_ids, "model": MODEL,
            "sampling_params": {"temperature": 0, "max_tokens": 40, "ignore_eos": True}}  # fmt: skip
    r = await gateway.client.post("/inference/v1/generate", headers=tenant.headers, json=body)
    assert r.status_code == 200, r.text
    generated = r.json()["choices"][0]["token_ids"]
    assert len(generated) == 40
    assert tok.decode(generated) == chat["choices"][0]["message"]["content"]
    assert chat["usage"]["completion_tokens"] == 40
    assert chat["usage"]["prompt_tokens"] == len(token_ids)


async def test_stop_string_across_tokens_aborts_the_engine_request(gateway: Gateway) -> None:
    """Acceptance 3: a stop string split over two tokens ends the completion at once."""
    tenant = await gateway.tenant()
    tok = gateway.state.tokenizer
    token_ids = tok.encode_chat([{"role": "user", "content": PROMPT}])
    body = {"token_ids": token_ids,
            "sampling_params": {"temperature": 0, "max_tokens": 30, "ignore_eos": True}}  # fmt: skip
    r = await gateway.client.post("/inference/v1/generate", headers=tenant.headers, json=body)
    generated = r.json()["choices"][0]["token_ids"]
    texts = [tok.decode(generated[: i + 1]) for i in range(len(generated))]
    # A boundary between tokens i and i+1 where both sides hold text and the 4 characters
    # around it occur nowhere earlier.
    for i in range(3, len(generated) - 1):
        before, after = texts[i], texts[i + 1]
        if len(before) >= 2 and len(after) - len(before) >= 2 and after.startswith(before):
            stop = before[-2:] + after[len(before) : len(before) + 2]
            if after.find(stop) == len(before) - 2:
                break
    else:
        pytest.fail("no usable token boundary in the greedy continuation")
    records_before = len(await gateway.usage_records(tenant))
    chat = await _chat(gateway, tenant, max_tokens=1500, ignore_eos=True, stop=[stop])
    choice = chat["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    assert choice["message"]["content"] == before[:-2]
    # The token that completed the stop string is the last one counted.
    assert chat["usage"]["completion_tokens"] == i + 2
    # Aborted: a 1500-token request would still be running.
    assert await _engine_idle(gateway) == 0
    records = await gateway.usage_records(tenant)
    assert len(records) == records_before + 1
    assert max(records, key=lambda r: r.finished_at).completion_tokens == i + 2


async def test_cache_salt_per_tenant(gateway: Gateway) -> None:
    """Acceptance 4: tenants never share cached prefixes; a client-sent salt changes nothing."""
    a, b = await gateway.tenant(), await gateway.tenant()
    first = await _chat(gateway, a, max_tokens=2)
    again = await _chat(gateway, a, max_tokens=2)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # B, even sending A's real salt (the pass-through field and the chat extra), sees nothing.
    salt_a = gateway.salt_of(a)
    other = await _chat(gateway, b, max_tokens=2, cache_salt=salt_a)
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    tok = gateway.state.tokenizer
    ids = tok.encode_chat([{"role": "user", "content": PROMPT + " Again."}])
    body = {"token_ids": ids, "sampling_params": {"max_tokens": 1}}
    r = await gateway.client.post("/inference/v1/generate", headers=a.headers, json=body)
    assert r.json()["usage"]["cached_tokens"] > 0  # shares A's prefix with the chat requests
    c = await gateway.tenant()  # B has cached this prompt for itself by now; C has not
    r = await gateway.client.post(
        "/inference/v1/generate", headers=c.headers, json={**body, "cache_salt": salt_a}
    )
    assert r.json()["usage"]["cached_tokens"] == 0
    again_b = await _chat(gateway, b, max_tokens=2)
    assert again_b["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # B's own cache
    # A's own cache works whatever salt A's client claims.
    claimed = await _chat(gateway, a, max_tokens=2, cache_salt="something-else")
    assert claimed["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_priority_tiers_map_to_engine_priorities(gateway: Gateway) -> None:
    """Acceptance 5: each tier's default and clamped hints reach the engine."""
    tiers = gateway.state.settings.tiers
    recorder = gateway.record_requests()
    try:
        for tier, band in tiers.items():
            tenant = await gateway.tenant(tier=tier)
            for hint, expected in (
                (None, band.default),
                (band.lo - 100, band.lo),  # more urgent than allowed: clamped, never raised
                (band.hi + 100, band.hi),
                ((band.lo + band.hi) // 2, (band.lo + band.hi) // 2),
            ):
                fields = {} if hint is None else {"priority": hint}
                await _chat(gateway, tenant, max_tokens=1, **fields)
                body = {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 1}, **fields}
                r = await gateway.client.post(
                    "/inference/v1/generate", headers=tenant.headers, json=body
                )
                assert r.status_code == 200
                sent = recorder.requests[-2:]
                assert [req.priority for req in sent] == [expected, expected], (tier, hint)
                assert all(req.fairness_key == tenant.tenant_id for req in sent)
    finally:
        gateway.stop_recording(recorder)


async def test_realtime_tier_runs_before_batch_tier(gateway: Gateway) -> None:
    """Acceptance 5, observed in scheduling: with the batch full, realtime goes first."""
    batch, realtime = await gateway.tenant(tier="batch"), await gateway.tenant(tier="realtime")
    done: list[str] = []
    hold = gateway.state.settings.engine.max_num_seqs

    async def run(tenant: Any, name: str, max_tokens: int) -> None:
        await _chat(gateway, tenant, max_tokens=max_tokens, ignore_eos=True)
        done.append(name)

    # Fill every running slot with batch work, then queue one more of each tier.
    engine = gateway.state.engine.engine  # type: ignore[attr-defined]
    fill = [asyncio.create_task(run(batch, "fill", 200)) for _ in range(hold)]
    while engine.stats().num_running < hold:
        await asyncio.sleep(0.01)
    late_batch = asyncio.create_task(run(batch, "batch", 4))
    while engine.stats().num_waiting < 1:
        await asyncio.sleep(0.01)
    late_realtime = asyncio.create_task(run(realtime, "realtime", 4))
    await asyncio.gather(*fill, late_batch, late_realtime)
    assert done.index("realtime") < done.index("batch")

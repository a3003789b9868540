"""A gateway in front of an engine that runs the fcfs policy: the tiers' priorities it sends
(standard's is 10) are taken and ignored, so requests are served (every one was a 400 before:
the engine refused any non-zero priority under fcfs)."""

from __future__ import annotations

from pathlib import Path

from gateway_harness import SecretScan, gateway_settings, running_gateway


async def test_a_gateway_over_an_fcfs_engine_serves_every_tier(
    tiny_model_dir: Path, tmp_path: Path, secret_scan: SecretScan
) -> None:
    settings = gateway_settings(tiny_model_dir, tmp_path, engine={"scheduling_policy": "fcfs"})
    async with running_gateway(settings, secret_scan) as gw:
        recorder = gw.record_requests()
        for tier in ("realtime", "standard", "batch"):
            tenant = await gw.tenant(tier=tier)
            r = await gw.client.post(
                "/v1/chat/completions",
                headers=tenant.headers,
                json=gw.chat_body("Hi", max_tokens=2),
            )
            assert r.status_code == 200, (tier, r.text)
        # the engine got the tiers' own priorities (not zeros): it is the engine that ignores them
        assert sorted({request.priority for request in recorder.requests}) == [0, 10, 20]

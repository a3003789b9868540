"""`trusted_hosts`: a Host the gateway does not serve is a 400 before any route sees it."""

from __future__ import annotations

from pathlib import Path

from gateway_harness import SecretScan, gateway_settings, running_gateway


async def test_only_trusted_host_names_are_served(
    tiny_model_dir: Path, tmp_path: Path, secret_scan: SecretScan
) -> None:
    settings = gateway_settings(tiny_model_dir, tmp_path, trusted_hosts=["gateway", "api.example"])
    async with running_gateway(settings, secret_scan) as gw:
        assert (await gw.client.get("/health")).status_code == 200  # Host: gateway
        ok = await gw.client.get("/health", headers={"host": "API.example:8443"})
        assert ok.status_code == 200
        r = await gw.client.get("/health", headers={"host": "evil.example"})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "invalid_host"

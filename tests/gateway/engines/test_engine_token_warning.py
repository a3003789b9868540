"""An HTTP-mode gateway on the database adapter store without an engine token: engines could not
fetch adapters from it (gateway/routes/internal.py), so start-up says so; with a token, or with
the directory store (engines load its paths), it says nothing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.engines.http import HttpEngineClient
from gateway.settings import GatewaySettings

WARNING = "LORAGATE_ENGINE_ADMIN_TOKEN is not set"


def _settings(model: Path, **overrides: Any) -> GatewaySettings:
    return GatewaySettings.model_validate({
        "model": model, "key_pepper": "k" * 8 + "abcdefghijklmnopqrstuvwx",
        "salt_secret": "s" * 8 + "zyxwvutsrqponmlkjihgfedc", "engine_mode": "http",
        "engine_urls": ["http://127.0.0.1:9"], **overrides,
    })  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        ({}, True),
        ({"engine_admin_token": "t" * 32}, False),
        ({"adapter_store": "directory"}, False),
    ],
)
async def test_start_up_warns_when_engines_cannot_fetch_adapters(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture, overrides: dict[str, Any], warned: bool
) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.engines.http"):
        client = HttpEngineClient.from_settings(_settings(tiny_model_dir, **overrides))
    await client.close()
    assert any(WARNING in r.getMessage() for r in caplog.records) is warned
    token = overrides.get("engine_admin_token")
    assert token is None or all(token not in r.getMessage() for r in caplog.records)

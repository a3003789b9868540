"""The engine client the settings ask for, started."""

from __future__ import annotations

from collections.abc import Callable

from gateway.engines.api import EngineClient
from gateway.settings import GatewaySettings


async def build_engine_client(
    settings: GatewaySettings, vllm_priority: Callable[[int], int]
) -> EngineClient:
    # Imported here: the in-process client loads torch and the engine, which HTTP mode never needs.
    if settings.engine_mode == "http":
        from gateway.engines.http import HttpEngineClient

        return HttpEngineClient.from_settings(settings, vllm_priority)
    from gateway.engines.inprocess import InProcessEngineClient

    return await InProcessEngineClient.from_settings(settings)

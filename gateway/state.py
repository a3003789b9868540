"""Everything the routes share, built once by the app's lifespan and kept on `app.state`."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.coordinator import Coordinator
from gateway.engine_api import EngineClient
from gateway.metrics import GatewayMetrics
from gateway.policy import PolicyService
from gateway.settings import GatewaySettings
from gateway.tokenizer import Tokenizer
from gateway.usage_writer import UsageWriter
from tenancy.runtime import TenancyRuntime


@dataclass
class GatewayState:
    settings: GatewaySettings
    tenancy: TenancyRuntime
    policy: PolicyService
    tokenizer: Tokenizer
    engine: EngineClient
    coordinator: Coordinator
    usage: UsageWriter
    metrics: GatewayMetrics

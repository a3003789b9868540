"""Everything the routes share, built once by the app's lifespan and kept on `app.state`."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.engines.api import EngineClient
from gateway.engines.pools import ModelPool
from gateway.lifecycle.bookkeeping import UsageWriter
from gateway.lifecycle.service import RequestLifecycle
from gateway.policy import PolicyService
from gateway.settings import GatewaySettings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing import Tracing
from gateway.text.tokenizer import Tokenizer
from tenancy.alerts.service import AlertService
from tenancy.runtime import TenancyRuntime


@dataclass
class GatewayState:
    settings: GatewaySettings
    tenancy: TenancyRuntime
    policy: PolicyService
    tokenizer: Tokenizer
    engine: EngineClient
    lifecycle: RequestLifecycle
    usage: UsageWriter
    metrics: GatewayMetrics
    # None: tracing is off (LORAGATE_OTEL_ENDPOINT unset).
    tracing: Tracing | None = None
    # Budget and outage alerts (tenancy/alerts/); None where a test builds the state without.
    alerts: AlertService | None = None
    # The other served base models' pools, by name (LORAGATE_MODELS); `tokenizer` and `engine`
    # above are the primary model's.
    others: dict[str, ModelPool] = field(default_factory=dict)

    def engines(self) -> dict[str, EngineClient]:
        """Every served base model's engine client, the primary's first."""
        primary = {self.policy.base_model: self.engine}
        return primary | {name: pool.engine for name, pool in self.others.items()}

"""Prometheus metrics of the gateway, on a registry of its own (state on the app, never global).

Labels are the tenant and the model only (plus a fixed set of rejection reasons), and both are
bounded, so no client can grow /metrics by sending random model names or creating tenants:
- the tenant is a digest of its id (`engine.protocol.tenant_label`, the engine's label for the
  same tenant), never the id; past `max_tenants` distinct tenants, further ones are `other`;
- a model label is a name that resolved (the base model or an adapter the tenant may use) or
  `unknown`; each tenant has its own bound of `max_models` names (its own adapters cannot push
  other tenants' models into `other`), past which its further ones are `other`.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from engine.protocol import tenant_label as hashed_tenant
from gateway.telemetry.usage import UsageLedgerCollector

UNKNOWN = "unknown"
OTHER = "other"
NO_TENANT = "unauthenticated"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)  # fmt: skip
OVERHEAD_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

# Rejections by reason: the error code, from a fixed set (anything else counts as `other`).
REJECTION_REASONS = frozenset({
    "invalid_api_key", "insufficient_scope", "model_not_found", "rate_limit_exceeded",
    "insufficient_quota", "overloaded", "engine_error", "request_too_large", "invalid_value",
    "invalid_json", "missing_required_parameter", "unsupported_parameter",
    "context_length_exceeded", "database_unavailable", "quota_store_unavailable",
    "identity_provider_unavailable", "shutting_down", "tenant_suspended",
})  # fmt: skip


def tenant_series_label(tenant_id: str) -> str:
    """The `tenant` label a tenant's series carry on /metrics (the admin API and the dashboard
    show it, so Grafana panels can be mapped to names). Past `max_tenants` distinct tenants in one
    gateway process, a later tenant's series are counted under `other` instead."""
    return hashed_tenant(tenant_id)


class BoundedLabel:
    """Passes the first `limit` distinct values through; later new ones become `other`."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self._limit:
            self._seen.add(value)
            return value
        return OTHER


@dataclass(frozen=True)
class RequestSeries:
    """One (tenant, model) pair's children of the per-request metrics: looked up once, since
    a `labels()` call costs a lock and a dict lookup per metric (seven a request)."""

    requests: Counter
    prompt_tokens: Counter
    completion_tokens: Counter
    cached_tokens: Counter
    ttft: Histogram
    e2e: Histogram
    overhead: Histogram


class GatewayMetrics:
    def __init__(self, *, max_tenants: int, max_models: int) -> None:
        self.registry = CollectorRegistry()
        self.tenant_label = BoundedLabel(max_tenants)
        self._max_models = max_models
        # tenant label -> its model names; at most max_tenants + 2 entries (other, no tenant).
        self._model_labels: dict[str, BoundedLabel] = {}
        # (tenant label, model label) -> its series; bounded as the labels are.
        self._series: dict[tuple[str, str], RequestSeries] = {}
        labels = ["tenant", "model"]
        r = self.registry
        self.requests = Counter(
            "loragate_gateway_requests", "Admitted inference requests.", labels, registry=r
        )
        self.prompt_tokens = Counter(
            "loragate_gateway_prompt_tokens", "Prompt tokens sent to engines.", labels, registry=r
        )
        self.completion_tokens = Counter(
            "loragate_gateway_completion_tokens", "Completion tokens.", labels, registry=r
        )
        self.cached_tokens = Counter(
            "loragate_gateway_cached_tokens", "Prompt tokens served from the prefix cache.",
            labels, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "loragate_gateway_time_to_first_token_seconds", "Time to first token, as clients see it.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "loragate_gateway_e2e_request_latency_seconds", "End-to-end request latency.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.overhead = Histogram(
            "loragate_gateway_overhead_seconds",
            "Time spent in the gateway itself (auth, quotas, tokenization, ...), engine excluded.",
            labels, buckets=OVERHEAD_BUCKETS, registry=r,
        )  # fmt: skip
        self.rejections = Counter(
            "loragate_gateway_rejections", "Rejected inference requests by reason.",
            [*labels, "reason"], registry=r,
        )  # fmt: skip
        self.usage_ledger = UsageLedgerCollector()  # the app points it at its usage writer
        r.register(self.usage_ledger)

    def labels(self, tenant: str | None, model: str | None) -> tuple[str, str]:
        tenant_label = self.tenant_label(tenant_series_label(tenant)) if tenant else NO_TENANT
        models = self._model_labels.get(tenant_label)
        if models is None:
            models = self._model_labels[tenant_label] = BoundedLabel(self._max_models)
        return tenant_label, models(model) if model else UNKNOWN

    def series(self, tenant: str | None, model: str | None) -> RequestSeries:
        labels = self.labels(tenant, model)
        found = self._series.get(labels)
        if found is None:
            found = self._series[labels] = RequestSeries(
                requests=self.requests.labels(*labels),
                prompt_tokens=self.prompt_tokens.labels(*labels),
                completion_tokens=self.completion_tokens.labels(*labels),
                cached_tokens=self.cached_tokens.labels(*labels),
                ttft=self.ttft.labels(*labels),
                e2e=self.e2e.labels(*labels),
                overhead=self.overhead.labels(*labels),
            )
        return found

    def reject(self, tenant: str | None, model: str | None, code: str | None) -> str:
        """Count a rejection; returns its reason label (the code, or `other`)."""
        reason = code if code in REJECTION_REASONS else OTHER
        self.rejections.labels(*self.labels(tenant, model), reason).inc()
        return reason

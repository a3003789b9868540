"""Prometheus metrics of one engine server, on a registry of its own (never the global one).

Gauges and counters that the engine keeps are read from its stats snapshot at scrape time;
latency histograms are observed where a request's outputs are read (`RequestMetrics`: the
engine server, or the gateway's in-process client in the embedded mode).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.outputs import EngineStats, FinishReason, LoRAStats, RequestOutput
from engine.protocol import is_error_output
from engine.protocol.labels import tenant_label
from engine.step.choices.choice import StartupChoice
from lora.remote.fetched import FetchedAdapters

# Bounded label cardinality: the busiest tenants by served tokens get their own series, the
# rest are summed into OTHER_TENANT.
MAX_TENANT_LABELS = 50
OTHER_TENANT = "other"

# vLLM's buckets, so dashboards built for vLLM read the same.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0)  # fmt: skip


def priority_band(priority: int) -> str:
    """A fixed, tiny label set for priorities (lower runs earlier)."""
    if priority < 0:
        return "lt0"
    return "0" if priority == 0 else "gt0"


def bounded_tenant_series(served: dict[str, int]) -> list[tuple[str, int]]:
    """(label, served tokens): the top MAX_TENANT_LABELS tenants, then the rest as `other`."""
    ranked = sorted(served.items(), key=lambda item: (-item[1], item[0]))
    series: dict[str, int] = {}
    for key, tokens in ranked[:MAX_TENANT_LABELS]:
        label = tenant_label(key)
        series[label] = series.get(label, 0) + tokens
    rest = sum(tokens for _, tokens in ranked[MAX_TENANT_LABELS:])
    if rest:
        series[OTHER_TENANT] = series.get(OTHER_TENANT, 0) + rest
    return list(series.items())


class EngineStatsCollector(Collector):
    """Reads the engine's stats snapshot at each scrape."""

    def __init__(
        self,
        stats: Callable[[], EngineStats],
        model_name: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._stats = stats
        self._model_name = model_name
        self._clock = clock

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self._model_name], value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self._model_name], value)
        return family

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        yield self._gauge(
            "vllm:num_requests_running", "Requests in the running batch.", stats.num_running
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting
        )
        yield self._gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = full).", stats.kv_usage)
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            stats.prefix_cache_queries_total,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache.",
            stats.prefix_cache_hits_total,
        )
        yield self._counter(
            "vllm:num_preemptions", "Preempted requests.", stats.num_preemptions_total
        )
        yield self._counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", stats.prompt_tokens_total
        )
        yield self._counter(
            "vllm:generation_tokens", "Generated tokens.", stats.generation_tokens_total
        )
        # A gauge, not a counter: the fairness counter may be lifted for new tenants, and the
        # `other` series changes membership as tenants move in and out of the top set.
        served = GaugeMetricFamily(
            "loragate_engine_served_tokens",
            "Served tokens per tenant in the fairness counter (top tenants, the rest as other).",
            labels=["model_name", "tenant"],
        )
        for label, tokens in bounded_tenant_series(stats.served_tokens_by_tenant):
            served.add_metric([self._model_name, label], tokens)
        yield served
        if stats.lora is not None:
            yield from self._lora(stats.lora)

    def _by_tier(self, name: str, doc: str, gpu: float, cpu: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["model_name", "tier"])
        family.add_metric([self._model_name, "gpu"], gpu)
        family.add_metric([self._model_name, "cpu"], cpu)
        return family

    def _lora(self, lora: LoRAStats) -> Iterator[Metric]:
        # The Gateway API Inference Extension's endpoint picker reads LoRA residency from this
        # series, exactly as vLLM exports it: no model_name label, adapter names joined by
        # commas, the snapshot's time as the value (the picker takes the newest series).
        info = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Adapters of running and waiting requests, and the adapter slots (max_lora).",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        info.add_metric(
            [str(lora.num_slots), ",".join(lora.running_adapters), ",".join(lora.waiting_adapters)],
            self._clock(),
        )
        yield info
        yield self._by_tier(
            "loragate_engine_adapter_hits",
            "Adapter acquisitions served by a tier (gpu: already in a slot; cpu: from the CPU cache).",
            lora.gpu_hits_total,
            lora.cpu_hits_total,
        )
        yield self._by_tier(
            "loragate_engine_adapter_misses",
            "Adapter acquisitions a tier could not serve (gpu: slot filled; cpu: read from disk).",
            lora.gpu_misses_total,
            lora.cpu_misses_total,
        )
        yield self._by_tier(
            "loragate_engine_adapter_evictions",
            "Adapters evicted from a tier.",
            lora.gpu_evictions_total,
            lora.cpu_evictions_total,
        )
        yield self._counter(
            "loragate_engine_adapter_loads", "Adapter reads from disk.", lora.loads_total
        )
        yield self._counter(
            "loragate_engine_adapter_load_seconds",
            "Seconds spent reading adapters from disk (prefetches included).",
            lora.load_seconds_total,
        )
        yield self._counter(
            "loragate_engine_adapter_prefetches",
            "Adapters read from disk ahead of the waiting requests that need them.",
            lora.prefetches_total,
        )
        yield self._gauge(
            "loragate_engine_adapter_slots",
            "Adapter slots on the device (max_loras).",
            lora.num_slots,
        )
        yield self._gauge(
            "loragate_engine_adapter_slots_occupied",
            "Adapter slots holding an adapter.",
            lora.num_slots_occupied,
        )
        yield self._gauge(
            "loragate_engine_adapter_slots_in_use",
            "Adapter slots pinned by running requests.",
            lora.num_slots_in_use,
        )
        yield self._gauge(
            "loragate_engine_adapters_cpu_cached",
            "Adapters held in the CPU cache.",
            lora.num_cpu_cached,
        )
        yield self._gauge(
            "loragate_engine_adapters_registered", "Registered adapters.", lora.num_adapters
        )


def finish_reason(output: RequestOutput) -> FinishReason:
    """A finished request's reason: an error output's is ERROR; with n > 1 the request ends with
    its last choice, and an abort anywhere marks it aborted."""
    if is_error_output(output):
        return FinishReason.ERROR
    reasons = [c.finish_reason for c in output.choices if c.finish_reason is not None]
    if FinishReason.ABORT in reasons:
        return FinishReason.ABORT
    return reasons[-1] if reasons else FinishReason.STOP


class RequestMetrics:
    """The per-request histograms and the finished-request counter, observed where a request's
    outputs are read: the engine server, or the gateway's in-process client (which registers
    them on the gateway's /metrics, so the embedded mode exports what a separate engine does)."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self._model_name = model_name
        labels = ["model_name"]
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self._tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            labels,
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Time from arrival to first scheduling.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._queue_by_band = Histogram(
            "loragate_engine_queue_wait_seconds",
            "Time from arrival to first scheduling, by priority band.",
            ["model_name", "priority_band"],
            buckets=QUEUE_BUCKETS,
            registry=registry,
        )
        self._success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=registry,
        )
        for reason in FinishReason:
            self._success.labels(model_name, reason.value)  # every series exists from the start

    def observe_output(self, output: RequestOutput, *, num_choices: int = 1) -> None:
        """Record a request from its final output; an output that is not final is skipped."""
        if output.finished:
            self.observe_finished(output, reason=finish_reason(output), num_choices=num_choices)

    def observe_finished(
        self, output: RequestOutput, *, reason: FinishReason, num_choices: int = 1
    ) -> None:
        """Record one finished request from its final output's timestamps."""
        self._success.labels(self._model_name, reason.value).inc()
        times = output.times
        if times is None:
            return
        model = self._model_name
        if times.first_scheduled is not None:
            waited = max(0.0, times.first_scheduled - times.arrival)
            self._queue.labels(model).observe(waited)
            self._queue_by_band.labels(model, priority_band(output.priority)).observe(waited)
        if times.first_token is not None:
            self._ttft.labels(model).observe(max(0.0, times.first_token - times.arrival))
        if times.finished is not None:
            self._e2e.labels(model).observe(max(0.0, times.finished - times.arrival))
            tokens_per_choice = output.num_output_tokens / max(1, num_choices)
            if times.first_token is not None and tokens_per_choice > 1:
                decode = max(0.0, times.finished - times.first_token)
                self._tpot.labels(model).observe(decode / (tokens_per_choice - 1))

    def observe_abandoned(self) -> None:
        """A request whose client went away before it finished (the engine aborted it)."""
        self._success.labels(self._model_name, FinishReason.ABORT.value).inc()


class EngineMetrics:
    """All metrics of one engine server; `registry` is what /metrics exposes."""

    def __init__(
        self,
        *,
        model_name: str,
        stats: Callable[[], EngineStats],
        choices: Sequence[StartupChoice] = (),
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineStatsCollector(stats, model_name))
        # Which native paths this start took decides the engine's speed: one series per choice
        # (engine/step/choices/startup.py), so a slow engine on a shared node shows why.
        startup = Gauge(
            "loragate_engine_startup_choice",
            "The path each start-up choice took (value) and where it came from (source: saved "
            "in the tuning file, timed at this start, pinned by an option, fixed by the "
            "machine); 1 per choice.",
            ["model_name", "choice", "value", "source"],
            registry=self.registry,
        )
        for choice in choices:
            startup.labels(model_name, choice.name, choice.value, choice.source).set(1)
        self.requests = RequestMetrics(self.registry, model_name)


class AdapterFetchCollector(Collector):
    """Adapters fetched from the gateway's store (lora/remote/): fetches, refusals, bytes, and
    the disk cache they are kept in."""

    def __init__(self, adapters: FetchedAdapters, model_name: str) -> None:
        self._adapters = adapters
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats, cache = self._adapters.stats, self._adapters.cache
        rows: list[tuple[type[CounterMetricFamily | GaugeMetricFamily], str, str, float]] = [
            (CounterMetricFamily, "fetches", "adapter bundles fetched, hash checked and unpacked",
             stats.num_fetches),
            (CounterMetricFamily, "fetch_refusals", "adapter bundles fetched and refused (a "
             "wrong hash, a truncated transfer, a malformed bundle)", stats.num_refused),
            (CounterMetricFamily, "fetch_bytes", "bytes of the adapter bundles fetched",
             stats.num_bytes),
            (GaugeMetricFamily, "disk_cache_bytes", "bytes of fetched adapters on local disk",
             cache.num_bytes),
            (CounterMetricFamily, "disk_cache_evictions", "fetched adapters evicted from the "
             "local disk", cache.stats.num_evictions),
        ]  # fmt: skip
        for kind, name, doc, value in rows:
            family = kind(f"loragate_engine_adapter_{name}", doc, labels=["model_name"])
            family.add_metric([self._model_name], value)
            yield family

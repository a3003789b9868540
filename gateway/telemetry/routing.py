"""Engine routing on /metrics (HTTP mode): per replica, the requests sent and why, the prompt
tokens sent, the cached tokens the gateway expected and those the engine reported.

Read at scrape time from the replicas' counters (replicas.py `RoutingCounts`), which the client
keeps as it routes and reads usage events, so the metrics say exactly what this process did. The
expected hit rate is expected / prompt tokens, the actual one cached / prompt tokens; the gap
says how often the routing's belief (the prefix is still in that engine's cache) held. Replicas
are labelled by index (`engine-0`), never by URL.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.engines.replicas import Replica


class RoutingCollector(Collector):
    def __init__(self, replicas: list[Replica]) -> None:
        self._replicas = replicas

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "loragate_gateway_engine_requests",
            "Engine requests sent to each replica, by why it was chosen.",
            labels=["replica", "route"],
        )
        prompt = CounterMetricFamily(
            "loragate_gateway_engine_prompt_tokens",
            "Prompt tokens sent to each replica.",
            labels=["replica"],
        )
        expected = CounterMetricFamily(
            "loragate_gateway_engine_expected_cached_tokens",
            "Prompt tokens the gateway expected each replica to find in its prefix cache.",
            labels=["replica"],
        )
        cached = CounterMetricFamily(
            "loragate_gateway_engine_cached_tokens",
            "Prompt tokens each replica reported it served from its prefix cache.",
            labels=["replica"],
        )
        outstanding = GaugeMetricFamily(
            "loragate_gateway_engine_outstanding",
            "This process's requests open on each replica.",
            labels=["replica"],
        )
        for replica in self._replicas:
            counts = replica.routing
            for reason, num in sorted(counts.num_requests.items()):
                requests.add_metric([replica.name, reason], num)
            prompt.add_metric([replica.name], counts.num_prompt_tokens)
            expected.add_metric([replica.name], counts.num_expected_cached_tokens)
            cached.add_metric([replica.name], counts.num_cached_tokens)
            outstanding.add_metric([replica.name], replica.outstanding)
        yield from (requests, prompt, expected, cached, outstanding)

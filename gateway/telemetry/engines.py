"""The in-process engines' own metrics (vLLM's names) on the gateway's /metrics, one set of
families however many base models are served.

Each engine registers its collectors and histograms on a registry of its own
(`register_metrics`, gateway/engines/inprocess.py): two engines on one registry would register
the same names twice, which prometheus_client refuses, and the exposition format allows a
family once. `EngineRegistries` reads them all at scrape time and merges families of the same
name; the series differ by their `model_name` label. The one family without it,
`vllm:lora_requests_info` (vLLM's shape, which the Inference Extension's endpoint picker reads
per engine), keeps the first engine's series (the primary model's): a second series with the
same labels would make the exposition invalid.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class EngineRegistries(Collector):
    def __init__(self, registries: Sequence[CollectorRegistry]) -> None:
        self._registries = list(registries)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for registry in self._registries:
            for family in registry.collect():
                into = merged.get(family.name)
                if into is None:
                    into = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = into
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key not in seen:
                        seen.add(key)
                        into.samples.append(sample)
        yield from merged.values()

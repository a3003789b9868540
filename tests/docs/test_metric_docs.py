"""The metrics tables of docs/operations.md list exactly what the gateway and the engine
export, and every metric the docs name exists (see docs_reading.py)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from tests.docs.docs_reading import OPERATIONS, doc_files, first_cell_names, rel, section

METRIC_MENTION = re.compile(r"(?:loragate_(?:gateway|engine)_[a-z0-9_]*|vllm:[a-z0-9_:]+)\*?")
METRIC_SUFFIXES = ("", "_bucket", "_sum", "_count", "_created")


def _zeros(cls: type) -> dict[str, Any]:
    """Zero for every required field of a stats dataclass."""
    return {
        f.name: 0
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }


def exported_metrics() -> set[str]:
    """The names a scrape shows: counters with `_total`, gauges and histograms as named."""
    import tempfile
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from engine.metrics import AdapterFetchCollector, EngineMetrics
    from engine.outputs import EngineStats, LoRAStats
    from gateway.telemetry.metrics import GatewayMetrics
    from gateway.telemetry.routing import RoutingCollector
    from lora.remote.disk_cache import DiskCache
    from lora.remote.fetched import FetchedAdapters

    stats = EngineStats(**{**_zeros(EngineStats), "lora": LoRAStats(**_zeros(LoRAStats))})
    routing = CollectorRegistry()  # the HTTP engine client's, on the gateway's registry
    routing.register(RoutingCollector([]))
    fetching = CollectorRegistry()  # an engine server's with --adapter-source
    with tempfile.TemporaryDirectory() as cache_dir:
        adapters = FetchedAdapters(DiskCache(Path(cache_dir), max_bytes=1), fetcher=None)  # type: ignore[arg-type]
        fetching.register(AdapterFetchCollector(adapters, "docs"))
        fetched = {
            family.name + "_total" * (family.type == "counter") for family in fetching.collect()
        }
    registries = [
        GatewayMetrics(max_tenants=1, max_models=1).registry,
        EngineMetrics(model_name="docs", stats=lambda: stats).registry,
        routing,
    ]
    return fetched | {
        family.name + ("_total" if family.type == "counter" else "")
        for registry in registries
        for family in registry.collect()
    }


def test_metrics_tables_list_exactly_the_exported_metrics() -> None:
    actual = exported_metrics()
    documented = first_cell_names(section(OPERATIONS, "Metrics"), r"[a-z_:][a-z0-9_:]*")
    missing = sorted(actual - set(documented))
    extra = sorted(set(documented) - actual)
    problems = []
    if missing:
        problems.append(f"metrics missing from {rel(OPERATIONS)}: {', '.join(missing)}")
    if extra:
        lines = ", ".join(f"{m} (line {documented[m][0][0]})" for m in extra)
        problems.append(f"{rel(OPERATIONS)} lists metrics nothing exports: {lines}")
    assert not problems, "\n".join(problems)


def test_every_metric_the_docs_name_exists() -> None:
    names = {name + suffix for name in exported_metrics() for suffix in METRIC_SUFFIXES}
    unknown = []
    for path in doc_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for mention in METRIC_MENTION.findall(line):
                if mention.endswith(("*", "_")):  # a prefix: `loragate_engine_adapter*`
                    ok = any(n.startswith(mention.rstrip("*")) for n in names)
                else:
                    ok = mention in names
                if not ok:
                    unknown.append(f"  {rel(path)}:{number}: {mention}")
    assert not unknown, "metrics named in the docs that nothing exports:\n" + "\n".join(unknown)

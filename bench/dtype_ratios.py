"""Each system at its best dtype, and loragate's ratios over the others (bench/engine_throughput.py
with `--dtype both`: bfloat16 is not every system's fastest dtype on every CPU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BestOf:
    tokens_per_s: dict[str, dict[str, float]]  # workload -> system -> its best tokens/s
    dtype: dict[str, dict[str, str]]  # workload -> system -> the dtype that gave it
    ratios: dict[str, float]  # see `ratios`


def best_of(by_dtype: dict[str, dict[str, Any]]) -> BestOf:
    """`by_dtype`: dtype -> that block's result (its `tokens_per_s` by workload and system, and
    `baseline_dtype`: the dtype the peers ran in there)."""
    best: dict[str, dict[str, float]] = {}
    best_dtype: dict[str, dict[str, str]] = {}
    for dtype, result in by_dtype.items():
        for workload, by_system in result["tokens_per_s"].items():
            for system, rate in by_system.items():
                if rate > best.setdefault(workload, {}).get(system, 0.0):
                    best[workload][system] = rate
                    ran_in = dtype if system == "loragate" else result["baseline_dtype"]
                    best_dtype.setdefault(workload, {})[system] = ran_in
    return BestOf(best, best_dtype, ratios(best))


def ratios(tokens_per_s: dict[str, dict[str, float]]) -> dict[str, float]:
    """loragate over each other system, per workload: `vs_<system>` for mixed,
    `vs_<system>_<workload>` for the others (`vs_vllm_compiled`, `vs_transformers_equal`...)."""
    found: dict[str, float] = {}
    for workload, by_system in tokens_per_s.items():
        suffix = "" if workload == "mixed" else f"_{workload}"
        for system, rate in by_system.items():
            if system != "loragate":
                key = f"vs_{system.replace('-', '_')}{suffix}"
                found[key] = by_system["loragate"] / rate
    return found

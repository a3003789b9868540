"""bench/routing.py --quick end to end (slow): three engines, one gateway per routing policy,
the JSON's shape, every figure finite; no thresholds (the full run's goals are in RESULTS.md)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "routing.py"
POLICY_FIELDS = {"num_requests", "prompt_tokens", "cached_tokens", "hit_rate", "ttft_p50_ms",
                 "ttft_p90_ms", "max_over_mean_load", "replicas"}  # fmt: skip
REPLICA_FIELDS = {"routes", "requests", "prompt_tokens", "expected_cached_tokens", "cached_tokens"}


def numbers(value: object) -> list[float]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return []
    return [float(value)]


@pytest.mark.slow
def test_quick_run_writes_the_json(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "routing.json"
    subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--model", str(tiny_model_dir), "--json", str(out)],
        check=True, timeout=600,
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert set(report["policies"]) == {"cache_aware", "least_loaded"}
    assert set(report["ratios"]) == {"cached_tokens", "ttft_p50"}
    assert set(report["max_over_mean_load"]) == {"cache_aware", "least_loaded"}
    for policy in report["policies"].values():
        assert set(policy) == POLICY_FIELDS
        assert policy["num_requests"] == 6 * 3  # quick: 6 conversations, 3 turns
        assert sorted(policy["replicas"]) == ["engine-0", "engine-1", "engine-2"]
        for replica in policy["replicas"].values():
            assert set(replica) == REPLICA_FIELDS
        # what the gateway sent each replica adds up to what the client sent
        assert sum(r["requests"] for r in policy["replicas"].values()) == policy["num_requests"]
        assert (
            sum(r["prompt_tokens"] for r in policy["replicas"].values()) == policy["prompt_tokens"]
        )
        # the cached tokens the gateway read from the engines' usage events, per replica
        replicas = policy["replicas"].values()
        assert sum(r["cached_tokens"] for r in replicas) == policy["cached_tokens"]
    values = numbers({k: report[k] for k in ("policies", "ratios", "max_over_mean_load")})
    assert values and all(math.isfinite(v) and v >= 0 for v in values)

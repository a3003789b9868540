"""bench/dtype_ratios.py: each system's best dtype per workload, and loragate's ratios named as the
issue's JSON keys (`vs_vllm_compiled`, `vs_vllm_compiled_equal`)."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench.bench_modules import load_bench_module


@pytest.fixture(scope="module")
def dtype_ratios() -> ModuleType:
    return load_bench_module("dtype_ratios")


def test_each_system_counts_at_its_best_dtype_and_the_peers_at_theirs(
    dtype_ratios: ModuleType,
) -> None:
    by_dtype = {
        "bfloat16": {
            "baseline_dtype": "bfloat16",
            "tokens_per_s": {
                "mixed": {"loragate": 600.0, "vllm-compiled": 400.0},
                "equal": {"loragate": 900.0, "vllm-compiled": 720.0},
            },
        },
        "float32": {
            "baseline_dtype": "float32",
            "tokens_per_s": {
                "mixed": {"loragate": 300.0, "vllm-compiled": 500.0},
                "equal": {"loragate": 450.0, "vllm-compiled": 600.0},
            },
        },
    }
    top = dtype_ratios.best_of(by_dtype)
    assert top.tokens_per_s == {
        "mixed": {"loragate": 600.0, "vllm-compiled": 500.0},
        "equal": {"loragate": 900.0, "vllm-compiled": 720.0},
    }
    assert top.dtype["mixed"] == {"loragate": "bfloat16", "vllm-compiled": "float32"}
    assert top.ratios == {"vs_vllm_compiled": 1.2, "vs_vllm_compiled_equal": 1.25}

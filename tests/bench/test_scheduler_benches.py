"""The scheduler benchmarks (bench/scheduler_scale.py, bench/fairness.py) on tiny settings: the
JSON keys the Makefile and bench/RESULTS.md read, a full batch, and the fairness and aging
readings they report (step counts, not timings)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench.bench_modules import load_bench_module


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    return load_bench_module("scheduler_scale")


@pytest.fixture(scope="module")
def fairness() -> ModuleType:
    return load_bench_module("fairness")


def test_scale_holds_a_full_batch_and_the_line_length(scale: ModuleType) -> None:
    cell = scale.measure(256, lora=False, steps=20, seed=0)
    assert cell["num_waiting"] == 256
    assert cell["mean_running"] > scale.MAX_NUM_SEQS - 2  # a full batch, give or take a finish


def test_scale_json_keys(scale: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    assert scale.main(["--quick", "--sizes", "64,128", "--steps", "3", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert set(payload["ms_per_step"]) == {"64", "128"}
    assert set(payload["ms_per_step_base"]) == {"64", "128"}


def test_fairness_quick_json_and_readings(fairness: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "fairness.json"
    assert fairness.main(["--quick", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert set(payload["ttft_ratio_vs_fcfs"]) == {"fixed", "varied"}
    assert all(ratio > 5 for ratio in payload["ttft_ratio_vs_fcfs"].values())
    assert payload["aging"]["within_bound"]
    assert payload["aging_disabled"]["wait_steps"] is None  # without aging: starved

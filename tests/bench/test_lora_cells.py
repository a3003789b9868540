"""A LoRA benchmark cell on the tiny model: it runs to the end and reports this cell's cache
counters as deltas and the slots its pool held (the adapter-name tuples of LoRAStats once made
every cell crash: a tuple minus a tuple)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def lora_throughput() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH_DIR))  # the bench scripts import their siblings by name
    try:
        yield importlib.import_module("lora_throughput")
    finally:
        sys.path.remove(str(BENCH_DIR))


def test_a_cell_reports_counter_deltas_and_its_slots(
    lora_throughput: ModuleType, tiny_model_dir: Path, tmp_path: Path
) -> None:
    lt = lora_throughput
    dirs = lt.make_adapters(tiny_model_dir, tmp_path, count=2, rank=8)
    adapters = {"x": dirs[0], "y": dirs[1]}
    requests = [lt.BenchRequest(i, (1, 2, 3, 4 + i), 3) for i in range(3)]
    args = argparse.Namespace(dtype="float32", rank=8, threads=torch.get_num_threads())
    cell = lt.run_loragate(
        "cell", "test", tiny_model_dir, args, requests, ["x", "y", None], adapters,
        max_loras=None, max_cpu_loras=None, lora_pool_memory_gb=0.5,
    )  # fmt: skip
    assert cell.num_tokens == 9
    assert cell.extra["num_slots"] == lt.MAX_NUM_SEQS  # 0.5 GiB holds more than a batch needs
    assert cell.extra["loads_total"] == 0  # registered with their payloads: no disk reads
    # The warm-up filled both slots: the timed run hits them.
    assert (cell.extra["gpu_hits_total"], cell.extra["gpu_misses_total"]) == (2, 0)
    assert "running_adapters" not in cell.extra


def test_a_defaults_cell_times_each_adapters_first_use(
    lora_throughput: ModuleType, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 47's (a) at the engine's defaults: the warm-up runs the base model only, so both
    adapters fill their slots inside the timed run, with the engine's own batch and slots."""
    from engine.config import EngineConfig

    lt = lora_throughput
    dirs = lt.make_adapters(tiny_model_dir, tmp_path, count=2, rank=8)
    adapters = {"x": dirs[0], "y": dirs[1]}
    requests = [lt.BenchRequest(i, (1, 2, 3, 4 + i), 3) for i in range(3)]
    args = argparse.Namespace(dtype="float32", rank=8, threads=1)
    cell = lt.run_loragate(
        "cell", "test", tiny_model_dir, args, requests, ["x", "y", None], adapters,
        max_loras=None, max_cpu_loras=None, defaults=True,
    )  # fmt: skip
    assert cell.num_tokens == 9
    assert (cell.extra["gpu_hits_total"], cell.extra["gpu_misses_total"]) == (0, 2)
    defaults = EngineConfig(model=str(tiny_model_dir))
    assert cell.extra["defaults"] is True
    assert cell.extra["max_num_seqs"] == defaults.max_num_seqs
    # `threads` is not passed at the defaults: the engine takes every core it may use.
    assert cell.extra["threads"] == len(os.sched_getaffinity(0))

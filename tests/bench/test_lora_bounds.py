"""The LoRA benchmark's decode-step bound: the fewest steps any scheduler could take."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench.bench_modules import load_bench_module


@pytest.fixture(scope="module")
def adapters() -> ModuleType:
    return load_bench_module("lora_adapters")


def test_each_limit_can_be_the_binding_one(adapters: ModuleType) -> None:
    bound = adapters.decode_step_bound
    # one adapter: the longest request decides
    assert bound([10, 30, 20], ["a", "a", "a"], max_loras=1, max_num_seqs=64) == 30
    # seats: 10 requests of 10 tokens through 2 seats need 50 steps
    assert bound([10] * 10, [None] * 10, max_loras=1, max_num_seqs=2) == 50
    # slots: 4 adapters whose longest requests decode 10, 20, 30, 40 steps, 2 slots: 50 steps
    lens, names = [10, 20, 30, 40, 5], ["a", "b", "c", "d", "d"]
    assert bound(lens, names, max_loras=2, max_num_seqs=64) == 50
    assert bound(lens, names, max_loras=4, max_num_seqs=64) == 40  # slots no longer bind
    assert bound(lens, [None] * 5, max_loras=1, max_num_seqs=64) == 40  # base model: no slots

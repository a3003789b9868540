"""The benchmark's seeded workload generator: deterministic and within its stated ranges."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench.bench_modules import load_bench_module


@pytest.fixture(scope="module")
def workload() -> ModuleType:
    return load_bench_module("workload")


POOL = list(range(3, 2708))
PINNED_SUMMARY = {
    "num_requests": 128,
    "num_prompt_tokens": 31817,
    "num_output_tokens": 16327,
    "max_prompt_len": 511,
    "max_output_len": 255,
}


def test_same_spec_same_requests(workload: ModuleType) -> None:
    spec = workload.WorkloadSpec("mixed", 128, prompt_len=(16, 512), output_len=(16, 256), seed=0)
    first = workload.make_workload(spec, POOL)
    assert first == workload.make_workload(spec, POOL)
    other_seed = workload.WorkloadSpec("mixed", 128, (16, 512), (16, 256), seed=1)
    assert first != workload.make_workload(other_seed, POOL)


def test_lengths_and_ids_within_ranges(workload: ModuleType) -> None:
    spec = workload.WorkloadSpec("mixed", 128, prompt_len=(16, 512), output_len=(16, 256), seed=0)
    requests = workload.make_workload(spec, POOL)
    assert [r.index for r in requests] == list(range(128))
    prompt_lens = [r.num_prompt_tokens for r in requests]
    output_lens = [r.num_output_tokens for r in requests]
    assert all(16 <= n <= 512 for n in prompt_lens)
    assert all(16 <= n <= 256 for n in output_lens)
    # Uniform over the range, not stuck at one end: 128 draws spread over most of it.
    assert min(prompt_lens) < 64 and max(prompt_lens) > 464
    assert min(output_lens) < 40 and max(output_lens) > 232
    pool = set(POOL)
    assert all(t in pool for r in requests for t in r.prompt_token_ids)


def test_pinned_values(workload: ModuleType) -> None:
    # Pins the generator: a change here changes every recorded benchmark number.
    spec = workload.WorkloadSpec("mixed", 128, prompt_len=(16, 512), output_len=(16, 256), seed=0)
    summary = workload.summarize(workload.make_workload(spec, POOL))
    assert summary == PINNED_SUMMARY


def test_equal_lengths(workload: ModuleType) -> None:
    spec = workload.WorkloadSpec("equal", 128, prompt_len=(128, 128), output_len=(128, 128), seed=1)
    requests = workload.make_workload(spec, POOL)
    assert {(r.num_prompt_tokens, r.num_output_tokens) for r in requests} == {(128, 128)}


@pytest.mark.parametrize(
    ("prompt_len", "output_len", "num_requests"),
    [((0, 4), (1, 1), 1), ((5, 4), (1, 1), 1), ((1, 1), (2, 1), 1), ((1, 1), (1, 1), 0)],
)
def test_invalid_specs_raise(
    workload: ModuleType,
    prompt_len: tuple[int, int],
    output_len: tuple[int, int],
    num_requests: int,
) -> None:
    with pytest.raises(ValueError):
        workload.WorkloadSpec("bad", num_requests, prompt_len, output_len, seed=0)


def test_empty_pool_raises(workload: ModuleType) -> None:
    spec = workload.WorkloadSpec("mixed", 1, (1, 1), (1, 1), seed=0)
    with pytest.raises(ValueError, match="token_pool"):
        workload.make_workload(spec, [])

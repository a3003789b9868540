"""Issue 14, adapters scaled by memory, on the real tiny engine: the slot pool is sized by its
byte budget, and adapter reads from disk run on the manager's reader thread, never on the engine
loop: while one request's read is blocked, the other sequences keep stepping and producing
tokens, and the blocked request completes once the read is let go. A read that fails fails its
request with a clear error and leaves the engine serving."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.models.llama import LORA_PROJECTIONS
from engine.request import EngineRequest
from engine.step.lora_setup import model_dims
from lora.layers import slot_num_bytes
from lora.loader import LoadedAdapter
from tests.engine.engine_helpers import Collected, request
from tests.lora.peft_builders import AdapterSpec, make_peft_adapter

READ_TIMEOUT_S = 60  # only a hang guard: the test never measures time


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("read-adapters")
    return [
        make_peft_adapter(
            tiny_model_dir, root / f"a{i}", AdapterSpec(f"a{i}", r=8, alpha=16, seed=20 + i)
        )
        for i in range(3)
    ]


def tiny_engine(model_dir: Path, **config: object) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(model_dir), num_kv_blocks=128, max_num_seqs=4, **config)  # type: ignore[arg-type]
    )


def register_off_cpu(engine: LLMEngine, dirs: list[Path]) -> None:
    """Register a0..a2 with a CPU tier of 2: a0 is evicted, so a request for it reads disk."""
    assert engine.lora is not None
    for i, path in enumerate(dirs):
        engine.lora.add(f"a{i}", str(path))
    assert engine.lora.describe()[0].tier == "disk"


def on_adapter(name: str, engine_request: EngineRequest) -> EngineRequest:
    return replace(engine_request, adapter_name=name)


def step_checked(engine: LLMEngine, collected: Collected) -> None:
    step = engine.scheduler.num_steps
    for out in engine.step():
        collected.add(out, step)
    engine.check_invariants()
    engine.scheduler.check_invariants()
    assert engine.lora is not None
    engine.lora.cache.check_invariants()


def test_a_blocked_disk_read_does_not_stop_the_other_sequences(
    tiny_model_dir: Path, adapter_dirs: list[Path]
):
    engine = tiny_engine(tiny_model_dir, max_loras=2, max_cpu_loras=2)
    register_off_cpu(engine, adapter_dirs)
    assert engine.lora is not None
    read: Callable[[str], LoadedAdapter] = engine.lora.read
    release = threading.Event()
    entered = threading.Event()

    def blocking_read(path: str) -> LoadedAdapter:
        if path == str(adapter_dirs[0]):
            entered.set()
            assert release.wait(READ_TIMEOUT_S), "the test never let the read go"
        return read(path)

    engine.lora.read = blocking_read
    engine.add_request(on_adapter("a0", request("slow", [1, 2, 3, 4], max_tokens=4)))
    engine.add_request(request("base", [5, 6, 7], max_tokens=12))
    engine.add_request(on_adapter("a1", request("fast", [8, 9], max_tokens=12)))
    collected = Collected()
    try:
        step_checked(engine, collected)
        assert entered.wait(READ_TIMEOUT_S), "the read never started"
        # The read of a0 is blocked on the reader thread: the engine keeps stepping.
        steps_before = engine.scheduler.num_steps
        while "base" not in collected.finish_step:
            step_checked(engine, collected)
            assert engine.lora.cache.is_loading(engine.lora.registry.get("a0").adapter_id)
        assert engine.scheduler.num_steps - steps_before >= 10
        assert len(collected.tokens_of("base")) == 12 and len(collected.tokens_of("fast")) == 12
        assert collected.tokens_of("slow") == [] and "fast" in collected.finish_step
    finally:
        release.set()
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        step_checked(engine, collected)
    assert len(collected.tokens_of("slow")) == 4
    assert collected.outputs["slow"][-1].error is None
    stats = engine.stats().lora
    assert stats is not None and stats.loads_total >= 1 and stats.cpu_misses_total >= 1


def test_a_failed_read_fails_its_request_with_a_clear_error(
    tiny_model_dir: Path, adapter_dirs: list[Path], tmp_path: Path
):
    engine = tiny_engine(tiny_model_dir, max_loras=2, max_cpu_loras=2)
    doomed = tmp_path / "doomed"
    shutil.copytree(adapter_dirs[0], doomed)
    register_off_cpu(engine, [doomed, *adapter_dirs[1:]])
    shutil.rmtree(doomed)  # gone from disk after registration, and not in the CPU tier
    engine.add_request(on_adapter("a0", request("bad", [1, 2, 3], max_tokens=4)))
    engine.add_request(request("base", [4, 5], max_tokens=4))
    collected = Collected()
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        step_checked(engine, collected)
    error = collected.outputs["bad"][-1].error
    assert error is not None and error.startswith("adapter could not be loaded")
    assert len(collected.tokens_of("base")) == 4


def test_the_slot_pool_is_sized_by_its_byte_budget(tiny_model_dir: Path):
    one = tiny_engine(tiny_model_dir, max_loras=1)
    assert one.lora is not None
    slot_bytes = one.lora.layers.num_bytes  # one slot's stacks, as allocated
    dims = model_dims(one.model_config, one.config)
    assert slot_bytes == slot_num_bytes(
        LORA_PROJECTIONS, dims, max_rank=16, element_size=one.dtype.itemsize
    )
    sized = tiny_engine(tiny_model_dir, lora_pool_memory_bytes=3 * slot_bytes + slot_bytes // 2)
    assert sized.lora is not None and sized.lora.cache.max_loras == 3
    assert sized.lora.layers.num_bytes <= 3 * slot_bytes + slot_bytes // 2
    # The default budget: at most one slot per sequence of a full batch.
    roomy = tiny_engine(tiny_model_dir)
    assert roomy.lora is not None and roomy.lora.cache.max_loras == roomy.config.max_num_seqs
    with pytest.raises(ValueError, match="lora_pool_memory_bytes"):
        tiny_engine(tiny_model_dir, lora_pool_memory_bytes=slot_bytes - 1)


def test_threads_are_set_once_at_engine_start(tiny_model_dir: Path):
    before = torch.get_num_threads()
    try:
        engine = tiny_engine(tiny_model_dir, enable_lora=False, threads=1)
        assert engine.num_threads == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)

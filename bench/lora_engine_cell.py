"""One loragate cell of bench/lora_throughput.py: an engine built for the cell's settings, its
adapters registered, a warm-up, then the workload timed (wall and this process's CPU), with the
cell's adapter-cache counters as deltas. lora_throughput.py runs each in a process of its own
(fresh_process.py).

A `defaults` cell is what a user gets: the engine's own EngineConfig defaults (KV cache, slots
and CPU tier sized from memory, every core) but the model, dtype and rank, and a warm-up on the
base model only, so each adapter's first use (disk read, slot fill) falls inside the timed run."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import engine_run
from lora_adapters import decode_step_bound
from lora_report import Cell
from peft_baseline import timed
from workload import BenchRequest

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams

MAX_NUM_SEQS = 64


def run_loragate(
    name: str,
    setting: str,
    model_dir: Path,
    args: argparse.Namespace,
    requests: Sequence[BenchRequest],
    assignment: Sequence[str | None],
    adapters: dict[str, Path],
    *,
    max_loras: int | None,
    max_cpu_loras: int | None,
    lora_pool_memory_gb: float = 1.0,
    enable_lora: bool = True,
    max_num_seqs: int = MAX_NUM_SEQS,
    defaults: bool = False,
) -> Cell:
    if defaults:
        config = EngineConfig(
            model=str(model_dir),
            dtype=args.dtype,
            enable_lora=enable_lora,
            max_lora_rank=args.rank,
        )
    else:
        config = EngineConfig(
            model=str(model_dir),
            dtype=args.dtype,
            num_kv_blocks=engine_run.kv_blocks_for(requests, block_size=16),
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=2048,
            enable_lora=enable_lora,
            lora_pool_memory_bytes=int(lora_pool_memory_gb * (1 << 30)),
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
            max_lora_rank=args.rank,
            threads=args.threads,
        )
    engine = LLMEngine(config)
    # The slots the pool holds (sized by memory unless max_loras caps it).
    num_slots = engine.lora.cache.max_loras if engine.lora is not None else max_loras or 1
    if engine.lora is not None:
        # Names sharing a directory share one read at registration (1000 names, few files).
        read = {path: engine.lora.read(str(path)) for path in set(adapters.values())}
        for adapter, path in adapters.items():
            engine.lora.add(adapter, str(path), read[path])
    warm = [BenchRequest(r.index, r.prompt_token_ids[:16], 4) for r in requests[:4]]
    # Defaults: the warm-up touches no adapter, so every first use is timed.
    _run(engine, warm, [None] * len(warm) if defaults else assignment[:4], "warmup", [])
    before = engine.stats().lora
    running: list[int] = []
    tokens, wall, cpu = timed(lambda: _run(engine, requests, assignment, "run", running))
    # The running set each step starts from: the slot limit shows here.
    extra: dict[str, Any] = {
        "num_steps": len(running),
        "mean_batch": sum(running) / len(running),
        "decode_step_bound": decode_step_bound(
            [r.num_output_tokens for r in requests],
            assignment if enable_lora else [None] * len(requests),
            max_loras=num_slots,
            max_num_seqs=config.max_num_seqs,
        ),
        "threads": engine.num_threads,
        "max_num_seqs": config.max_num_seqs,
        "defaults": defaults,
    }
    if before is not None and (after := engine.stats().lora) is not None:
        # Counters as this cell's deltas; the adapter-name tuples (for the GIE metric) are not.
        extra |= {
            k: v - getattr(before, k)
            for k, v in asdict(after).items()
            if isinstance(v, int | float)
        }
    extra["num_slots"] = num_slots  # a gauge: the pool's size, not a delta (LoRAStats has it too)
    cell = Cell(name, "loragate", setting, len(requests), len(requests), tokens, wall, cpu, extra)
    print(
        f"  {name} ({setting}): {cell.tokens_per_s:.1f} tok/s wall, "
        f"{cell.tokens_per_cpu_s:.1f} tok/cpu-s, mean batch {extra['mean_batch']:.1f}, "
        f"{extra['num_steps']} steps (decode needs >= {extra['decode_step_bound']}), "
        f"{num_slots} slots, {engine.num_threads} threads",
        flush=True,
    )
    return cell


def _run(
    engine: LLMEngine,
    requests: Sequence[BenchRequest],
    assignment: Sequence[str | None],
    label: str,
    running: list[int],
) -> int:
    for r, adapter in zip(requests, assignment, strict=True):
        params = SamplingParams(temperature=0.0, max_tokens=r.num_output_tokens, ignore_eos=True)
        rid = RequestId(f"{label}-{r.index}")
        engine.add_request(EngineRequest(rid, r.prompt_token_ids, params, adapter_name=adapter))
    num_tokens = 0
    while engine.has_unfinished_requests():
        running.append(len(engine.scheduler.running))
        for out in engine.step():
            if out.error is not None:
                raise RuntimeError(f"{out.request_id} failed: {out.error}")
            num_tokens += sum(len(c.token_ids) for c in out.choices)
    if num_tokens != sum(r.num_output_tokens for r in requests):
        raise RuntimeError(f"{label}: {num_tokens} tokens, not each request's own length")
    return num_tokens

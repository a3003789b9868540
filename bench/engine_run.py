"""The loragate engine side: build it, submit a whole workload at once, step it to completion.

Timing covers add_request through the last step (scheduling, sampling and output assembly
included); the model load and a short warm-up are outside it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from flops import FlopCount
from measurement import SystemResult
from workload import BenchRequest

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class EngineSettings:
    max_num_seqs: int
    max_num_batched_tokens: int
    num_kv_blocks: int
    block_size: int = 16
    prepack_weights: bool = True  # the engine's default (engine/step/packed_linear.py)


@dataclass(frozen=True)
class EngineRun:
    result: SystemResult
    num_steps: int
    num_cached_tokens: int  # prefix-cache hits; random prompts should give 0
    num_preemptions: int


@dataclass(frozen=True)
class DecodePhase:
    """The steps after every request's prefill finished: pure decode of the whole batch."""

    settings: EngineSettings
    num_steps: int
    elapsed_s: float
    flops: FlopCount
    batch_sizes: tuple[int, ...]  # sequences decoded per step


def kv_blocks_for(requests: Sequence[BenchRequest], block_size: int) -> int:
    """Blocks for every request's full context at once, so the run never preempts."""
    return sum(-(-(r.num_prompt_tokens + r.num_output_tokens) // block_size) for r in requests)


def build_engine(model_dir: Path, dtype: str, settings: EngineSettings) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype=dtype,
            block_size=settings.block_size,
            num_kv_blocks=settings.num_kv_blocks,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            prepack_weights=settings.prepack_weights,
            # The bench's --threads (already set): the engine's default would be every core.
            threads=torch.get_num_threads(),
            # The native paths this machine saved (engine/step/choices/tuning.py), as `loragate
            # engine` reads them: a run beside a busy process takes the paths a quiet one did.
            tuning="saved",
        )
    )


def _submit(engine: LLMEngine, requests: Sequence[BenchRequest], label: str) -> None:
    for r in requests:
        engine.add_request(
            EngineRequest(
                request_id=RequestId(f"{label}-{r.index}"),
                prompt_token_ids=r.prompt_token_ids,
                sampling_params=SamplingParams(
                    temperature=0.0, max_tokens=r.num_output_tokens, ignore_eos=True
                ),
            )
        )


def warm_up(engine: LLMEngine, requests: Sequence[BenchRequest]) -> None:
    """A few short requests so one-time kernel selection and allocator growth are not timed;
    their prompts must share no block with the timed ones (the prefix cache is on)."""
    _submit(engine, requests, "warmup")
    while engine.has_unfinished_requests():
        engine.step()


def run_engine(
    engine: LLMEngine, requests: Sequence[BenchRequest], settings: EngineSettings, label: str
) -> EngineRun:
    stats_before = engine.stats()
    counts = {f"{label}-{r.index}": 0 for r in requests}
    num_cached = 0
    num_steps = 0
    start = time.perf_counter()
    _submit(engine, requests, label)
    while engine.has_unfinished_requests():
        num_steps += 1
        for out in engine.step():
            counts[out.request_id] += sum(len(c.token_ids) for c in out.choices)
            if out.finished:
                num_cached += out.num_cached_tokens
    elapsed = time.perf_counter() - start
    _check_lengths(requests, counts, label)
    num_tokens = sum(counts.values())
    result = SystemResult(
        system="loragate",
        batch_size=settings.max_num_seqs,
        num_requests=len(requests),
        num_requests_total=len(requests),
        num_useful_tokens=num_tokens,
        num_generated_tokens=num_tokens,
        elapsed_s=elapsed,
    )
    preemptions = engine.stats().num_preemptions_total - stats_before.num_preemptions_total
    return EngineRun(result, num_steps, num_cached, preemptions)


def run_decode_phase(
    engine: LLMEngine, requests: Sequence[BenchRequest], settings: EngineSettings, label: str
) -> DecodePhase:
    """Runs `requests` to completion and times only the steps after the last prefill.

    Meant for equal-length requests that fit in one batch and prefill in one step: then every
    timed step decodes all of them, and its FLOPs follow from the context lengths.
    """
    by_id = {f"{label}-{r.index}": r for r in requests}
    num_generated = dict.fromkeys(by_id, 0)
    _submit(engine, requests, label)
    while not all(num_generated.values()):
        for out in engine.step():
            num_generated[out.request_id] += sum(len(c.token_ids) for c in out.choices)
    flops = FlopCount()
    batch_sizes = []
    elapsed = 0.0
    while engine.has_unfinished_requests():
        # The token sampled last step is fed now: it sits at position prompt + generated - 1,
        # so it attends to prompt + generated keys.
        live = [
            r.num_prompt_tokens + num_generated[rid]
            for rid, r in by_id.items()
            if num_generated[rid] < r.num_output_tokens
        ]
        start = time.perf_counter()
        outputs = engine.step()
        elapsed += time.perf_counter() - start
        flops.add_decode(live)
        batch_sizes.append(len(live))
        for out in outputs:
            num_generated[out.request_id] += sum(len(c.token_ids) for c in out.choices)
    _check_lengths(requests, num_generated, label)
    return DecodePhase(settings, len(batch_sizes), elapsed, flops, tuple(batch_sizes))


def _check_lengths(requests: Sequence[BenchRequest], counts: dict[str, int], label: str) -> None:
    # ignore_eos with max_tokens = the request's length: anything else is an engine bug and
    # would make the throughput number meaningless.
    for r in requests:
        got = counts[f"{label}-{r.index}"]
        if got != r.num_output_tokens:
            raise RuntimeError(f"request {r.index}: {got} tokens, expected {r.num_output_tokens}")

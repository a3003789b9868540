"""vLLM with LoRA on the LoRA benchmark's workload: the same requests, the same PEFT adapter
directories, round-robin over the same 8 names, interleaved with loragate's (a) cells.

vLLM runs offline (`vllm_offline.py`: compiled, its default) with `enable_lora`, `max_loras` 8,
`max_lora_rank` 16, `max_cpu_loras` 8 and the engine's batch limits. Before timing, a warm-up
request per adapter loads all 8 into vLLM's CPU cache (loragate reads them at registration):
neither system reads an adapter from disk inside its timed cells. Its cells are timed by wall
clock (the generate call) and by the CPU time of vLLM's whole process tree (API, engine core and
worker run as separate processes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import vllm_offline
from lora_report import Cell
from workload import BenchRequest

OUT_DIR = Path(__file__).resolve().parent / "out"


class LoraVllm:
    """A loaded LoRA-enabled vLLM and the cells it ran, for the ratios."""

    def __init__(self, worker: vllm_offline.VllmWorker, adapters: dict[str, Path]) -> None:
        self.worker = worker
        self.adapters = adapters
        self.tries: dict[str, list[Cell]] = {"vllm-base": [], "vllm-lora": []}

    def round(self, requests: Sequence[BenchRequest], mix: Sequence[str | None]) -> None:
        """One vLLM base cell (no adapter) and one 8-adapter cell."""
        for name, assignment, setting in (
            ("vllm-base", [None] * len(requests), "no adapter, LoRA enabled"),
            ("vllm-lora", mix, f"{len(self.adapters)} adapters, max_loras 8"),
        ):
            run = self.worker.run(requests, assignment, self.adapters)
            cell = Cell(name, "vllm", setting, len(requests), len(requests), run.num_tokens,
                        run.elapsed_s, run.cpu_s, {"settings": asdict(self.worker.settings)})  # fmt: skip
            self.tries[name].append(cell)
            print(f"  {name}: {cell.tokens_per_s:.1f} tok/s wall, "
                  f"{cell.tokens_per_cpu_s:.1f} tok/cpu-s (vLLM's processes)", flush=True)  # fmt: skip

    def best(self) -> tuple[Cell, Cell]:
        """(base, lora): the fastest run of each by wall time."""
        base, lora = (min(self.tries[k], key=lambda c: c.wall_s) for k in self.tries)
        return base, lora

    def close(self) -> None:
        self.worker.close()


def start(
    model_dir: Path,
    dtype: str,
    requests: Sequence[BenchRequest],
    adapters: dict[str, Path],
    *,
    rank: int,
    max_num_seqs: int,
    mode: str,
) -> LoraVllm | None:
    """A warmed-up LoRA vLLM, or None (reason printed) when the vLLM venv is missing."""
    longest = max(r.num_prompt_tokens + r.num_output_tokens for r in requests)
    num_tokens = sum(
        sorted((r.num_prompt_tokens + r.num_output_tokens for r in requests), reverse=True)[
            :max_num_seqs
        ]
    )
    settings = vllm_offline.VllmSettings(
        mode=mode,
        dtype=dtype,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=2048,
        max_model_len=longest,
        kv_cache_gib=vllm_offline.kv_cache_gib(model_dir, dtype, num_tokens),
        enable_lora=True,
        max_loras=len(adapters),
        max_lora_rank=rank,
        max_cpu_loras=len(adapters),
    )
    workers = vllm_offline.start_workers(model_dir, [settings], OUT_DIR)
    if not workers:
        return None
    vllm = LoraVllm(workers[mode], adapters)
    names = list(adapters)
    warm = [BenchRequest(i, requests[i % len(requests)].prompt_token_ids[:16], 4)
            for i in range(len(names))]  # fmt: skip
    vllm.worker.run(warm, names, adapters)
    return vllm


def vllm_ratios(loragate_lora: Cell, vllm: LoraVllm) -> tuple[dict[str, float], list[Cell]]:
    """`vs_vllm_lora` (loragate's 8-adapter tokens/s over vLLM's, wall clock: both had the same
    cores), the same by CPU time, and vLLM's own LoRA overhead; plus its two cells."""
    base, lora = vllm.best()
    return {
        "vs_vllm_lora": loragate_lora.tokens_per_s / lora.tokens_per_s,
        "vs_vllm_lora_cpu": loragate_lora.tokens_per_cpu_s / lora.tokens_per_cpu_s,
        "vllm_lora_overhead": lora.wall_s / base.wall_s,
    }, [base, lora]

"""What one benchmark run measures: workloads, engine settings, baseline batch sizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workload import WorkloadSpec

from engine.make_model import make_model


@dataclass(frozen=True)
class Plan:
    model_size: str  # built when --model has no checkpoint
    workloads: tuple[WorkloadSpec, ...]
    decode_workload: WorkloadSpec  # equal lengths, all in one batch of `decode_batch`
    decode_batch: int
    max_num_seqs: int
    max_num_batched_tokens: int
    # transformers batch size -> requests run (a prefix of the workload; None = all). Batch 1
    # over all 128 requests alone would take longer than the whole benchmark should.
    hf_requests: tuple[tuple[int, int | None], ...]
    matmul_sizes: tuple[int, ...]


FULL = Plan(
    model_size="small",
    workloads=(
        WorkloadSpec("mixed", 128, prompt_len=(16, 512), output_len=(16, 256), seed=0),
        WorkloadSpec("equal", 128, prompt_len=(128, 128), output_len=(128, 128), seed=1),
    ),
    decode_workload=WorkloadSpec("decode64", 64, (128, 128), (128, 128), seed=2),
    decode_batch=64,
    # 64 rather than 128: measured equal on the mixed workload (decode attention pads every
    # sequence to the batch's longest context, which eats the larger batch's matmul gain).
    max_num_seqs=64,
    max_num_batched_tokens=2048,
    hf_requests=((1, 4), (16, 32), (64, None)),
    matmul_sizes=(1024, 2048, 4096),
)

QUICK = Plan(
    model_size="tiny",
    workloads=(
        WorkloadSpec("mixed", 32, prompt_len=(16, 128), output_len=(16, 64), seed=0),
        WorkloadSpec("equal", 32, prompt_len=(64, 64), output_len=(64, 64), seed=1),
    ),
    decode_workload=WorkloadSpec("decode64", 64, (64, 64), (32, 32), seed=2),
    decode_batch=64,
    max_num_seqs=64,
    max_num_batched_tokens=2048,
    hf_requests=((1, 4), (16, None), (64, None)),
    matmul_sizes=(512, 1024),
)

# Different seed and lengths from every workload, so no warm-up block is a prefix-cache hit.
WARMUP = WorkloadSpec("warmup", 4, prompt_len=(16, 16), output_len=(4, 4), seed=99)


def ensure_model(model_dir: Path, size: str) -> Path:
    if not (model_dir / "config.json").exists():
        print(f"building the {size} checkpoint in {model_dir}", flush=True)
        make_model(model_dir, size=size)
    return model_dir

"""Where the engine's time goes: cProfile (Python) and torch.profiler (operators) over a run.

    python bench/profile_engine.py --model .cache/models/small --threads 1

Runs the benchmark's mixed workload (or `--workload decode64`, the batch-64 decode run) on the
engine with the benchmark's settings and prints the top functions by cumulative and self time,
then the top operators. Profiling slows the run down; its numbers are shares, not throughput.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import engine_run
import torch
from plan import FULL, WARMUP, ensure_model
from torch.profiler import ProfilerActivity, profile
from workload import make_workload, token_pool


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".cache/models/small"))
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workload", choices=("mixed", "equal", "decode64"), default="mixed")
    parser.add_argument("--num-requests", type=int, default=None, help="a prefix of the workload")
    parser.add_argument("--top", type=int, default=25)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = ensure_model(args.model, FULL.model_size)
    specs = {spec.name: spec for spec in (*FULL.workloads, FULL.decode_workload)}
    requests = make_workload(specs[args.workload], token_pool(model_dir))[: args.num_requests]
    max_num_seqs = FULL.decode_batch if args.workload == "decode64" else FULL.max_num_seqs
    settings = engine_run.EngineSettings(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=FULL.max_num_batched_tokens,
        num_kv_blocks=engine_run.kv_blocks_for(requests, block_size=16),
    )
    engine = engine_run.build_engine(model_dir, args.dtype, settings)
    engine_run.warm_up(engine, make_workload(WARMUP, token_pool(model_dir)))

    profiler = cProfile.Profile()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as ops:
        profiler.enable()
        run = engine_run.run_engine(engine, requests, settings, args.workload)
        profiler.disable()
    elapsed = time.perf_counter() - start
    print(
        f"{len(requests)} requests, {run.num_steps} steps, {run.result.num_useful_tokens} tokens "
        f"in {elapsed:.1f}s under the profilers ({settings})\n"
    )
    for sort in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(args.top)
        print(f"== cProfile by {sort} ==")
        print(_strip_preamble(out.getvalue()))
    print("== torch operators by self CPU time ==")
    print(ops.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    return 0


def _strip_preamble(text: str) -> str:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("ncalls"):
            return "\n".join(lines[i:])
    return text


if __name__ == "__main__":
    sys.exit(main())

"""One cell of bench/source_ab.py, run with another checkout's code: this script puts the tree
given by --tree (its bench/ and its packages) ahead of everything on sys.path, so the cell runs
that tree's engine through that tree's own bench helpers. Prints one JSON line: the cell's
tokens, wall and CPU seconds.

    python bench/source_ab_cell.py --tree /path/to/checkout --cell engine --threads 2

Cells: `engine` (bench/engine_throughput.py's full mixed workload through engine_run),
`lora-base` / `lora` (bench/lora_throughput.py's (a): 64 requests on the base model, or over 8
rank-16 adapters with 8 slots, through lora_engine_cell). Only names both trees have are used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _use_tree(tree: Path) -> None:
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [str(tree / "bench"), str(tree)] + [p for p in sys.path if p != here]


def _engine_cell(args: argparse.Namespace) -> dict[str, float]:
    import engine_run
    import plan
    import torch
    import workload

    torch.set_num_threads(args.threads)
    model_dir = Path(args.model)
    spec = plan.FULL.workloads[0]  # mixed lengths
    pool = workload.token_pool(model_dir)
    requests = workload.make_workload(spec, pool)
    settings = engine_run.EngineSettings(
        max_num_seqs=plan.FULL.max_num_seqs,
        max_num_batched_tokens=plan.FULL.max_num_batched_tokens,
        num_kv_blocks=engine_run.kv_blocks_for(requests, block_size=16),
    )
    engine = engine_run.build_engine(model_dir, args.dtype, settings)
    engine_run.warm_up(engine, workload.make_workload(plan.WARMUP, pool))
    cpu = time.process_time()
    run = engine_run.run_engine(engine, requests, settings, "ab")
    return {
        "tokens": run.result.num_useful_tokens,
        "wall_s": run.result.elapsed_s,
        "cpu_s": time.process_time() - cpu,
    }


def _lora_cell(args: argparse.Namespace) -> dict[str, float]:
    import lora_throughput as lt
    import torch

    torch.set_num_threads(args.threads)
    model_dir = Path(args.model)
    plan = lt.FULL
    requests = lt.make_workload(plan.workload, lt.token_pool(model_dir))
    dirs = lt.make_adapters(model_dir, Path(args.adapter_dir), count=plan.num_adapters,
                            rank=plan.rank)  # fmt: skip
    eight = {f"lora{i}": dirs[i] for i in range(plan.num_adapters)}
    assignment = (
        lt.round_robin(len(requests), list(eight))
        if args.cell == "lora"
        else [None] * len(requests)
    )
    cell_args = argparse.Namespace(dtype=args.dtype, rank=plan.rank, threads=args.threads)
    cell = lt.run_loragate(args.cell, args.cell, model_dir, cell_args, requests, assignment, eight,
                           max_loras=8, max_cpu_loras=8)  # fmt: skip
    return {"tokens": cell.num_tokens, "wall_s": cell.wall_s, "cpu_s": cell.cpu_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True)
    parser.add_argument("--cell", choices=["engine", "lora-base", "lora"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--adapter-dir", required=True)
    args = parser.parse_args()
    _use_tree(args.tree.resolve())
    result = _engine_cell(args) if args.cell == "engine" else _lora_cell(args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

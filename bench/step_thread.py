"""Does stepping the engine from a worker thread cost time? One request, 64 greedy decode steps.

    python bench/step_thread.py --model .cache/models/small --threads 2
    python bench/step_thread.py --no-prepack   # plain F.linear weights (engine/step/packed_linear.py)

The gateway's in-process engine steps `LLMEngine` on a thread of its own (engine/loop/async_engine.py);
`loragate engine` (since session 5) and bench/engine_throughput.py step it on the main thread. This
times the same decode steps (128-token prompt, batch 1) on the main thread, then on a worker
thread while the main thread waits in `join`, then while it idles in an asyncio loop, and prints
the median step of each. Seen on the 2-core AMD EPYC box (issue 14, session 4): 20-27 ms on the
main thread against 31-38 ms on a worker at 2 threads, the same at 1 thread; OMP_WAIT_POLICY,
OMP_PROC_BIND, KMP_BLOCKTIME, MALLOC_ARENA_MAX and torch.set_num_threads inside the worker
changed nothing. It explained most of the gap between the step time and the HTTP engine's
inter-token latency in bench/latency.py, hence engine/loop/on_main.py.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_run
import torch
from plan import FULL, ensure_model
from workload import BenchRequest

from engine.loop.llm_engine import LLMEngine


def request(index: int) -> BenchRequest:
    # Prompts of distinct token ids per run, so no run hits another's prefix cache.
    return BenchRequest(index, tuple(range(100 + index, 228 + index)), num_output_tokens=64)


def median_step_ms(engine: LLMEngine, index: int) -> float:
    engine_run._submit(engine, [request(index)], f"run{index}")
    engine.step()  # the prefill
    times: list[float] = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def on_worker(engine: LLMEngine, index: int, *, asyncio_main: bool) -> float:
    result: list[float] = []
    worker = threading.Thread(target=lambda: result.append(median_step_ms(engine, index)))
    worker.start()
    if asyncio_main:

        async def idle() -> None:
            while worker.is_alive():
                await asyncio.sleep(0.05)

        asyncio.run(idle())
    worker.join()
    return result[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".cache/models/small"))
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-prepack", action="store_true", help="plain F.linear weights, not oneDNN-packed"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = ensure_model(args.model, FULL.model_size)
    settings = engine_run.EngineSettings(
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        num_kv_blocks=512,
        prepack_weights=not args.no_prepack,
    )
    engine = engine_run.build_engine(model_dir, args.dtype, settings)
    engine_run.warm_up(engine, [request(10_000)])
    packed = "packed" if engine.packed_linears else "plain"
    print(f"{args.dtype}, {torch.get_num_threads()} threads, {packed} weights, median decode (ms):")
    print("round  main thread  worker (join)  worker (asyncio main)")
    index = 0
    for round_ in range(args.rounds):
        cells = []
        for where in ("main", "join", "asyncio"):
            index += 1
            if where == "main":
                cells.append(median_step_ms(engine, index))
            else:
                cells.append(on_worker(engine, index, asyncio_main=where == "asyncio"))
        print(f"{round_:5d}  {cells[0]:11.2f}  {cells[1]:13.2f}  {cells[2]:21.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Scheduler cost per step against the length of the waiting line (no model).

The real Scheduler and BlockManager (and, in the `lora` setting, an AdapterCache with stand-in
payloads) are stepped by a model-free runner (`sched_driver.py`). A full batch runs
(`max_num_seqs` = 64 decoding sequences) while the waiting line is held at N: every request the
scheduler admits is replaced by a new arrival, so each timed step sees a full batch and N
waiting. Only `schedule()` is timed (`time.perf_counter()` around the call).

Workload (seeded): 32 tenants (request i from tenant i % 32), priorities 0 (80%), 1 (15%) and -1
(5%), prompts 32..256 tokens, outputs 16..128 tokens; `lora`: 16 registered adapters and
`max_loras=4` slots, half the requests on the base model, the rest spread over the adapters.
Engine settings: the EngineConfig defaults (priority policy, aging_steps 64,
max_num_batched_tokens 2048, block size 16), with a KV pool that never runs out.

    python bench/scheduler_scale.py [--quick] [--json PATH] [--sizes 64,4096,16384] [--steps N]

Goal (issue 14): at most 1 ms per step at 16,384 waiting with a full batch.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sched_driver import Driver

from engine.config import EngineConfig

NUM_TENANTS = 32
NUM_ADAPTERS = 16
MAX_NUM_SEQS = 64


class Workload:
    def __init__(self, driver: Driver, *, lora: bool, seed: int):
        self.driver = driver
        self.lora = lora
        self.rng = random.Random(seed)
        self.count = 0

    def submit(self) -> None:
        i, rng = self.count, self.rng
        self.count += 1
        roll = rng.random()
        priority = 0 if roll < 0.8 else (1 if roll < 0.95 else -1)
        adapter = None
        if self.lora and rng.random() < 0.5:
            adapter = rng.randrange(1, NUM_ADAPTERS + 1)
        self.driver.submit(
            f"r{i}",
            prompt_len=rng.randint(32, 256),
            max_tokens=rng.randint(16, 128),
            priority=priority,
            tenant=f"tenant-{i % NUM_TENANTS}",
            adapter_id=adapter,
        )


def measure(num_waiting: int, *, lora: bool, steps: int, seed: int) -> dict[str, Any]:
    config = EngineConfig(model="unused", max_num_seqs=MAX_NUM_SEQS)
    # Every live request's full context (<= 384 tokens = 24 blocks) at once, and then some.
    num_blocks = (num_waiting + MAX_NUM_SEQS) * 24 + 1024
    driver = Driver.create(
        config, num_blocks=num_blocks, num_adapters=NUM_ADAPTERS if lora else 0, seed=seed
    )
    work = Workload(driver, lora=lora, seed=seed)
    for _ in range(num_waiting + MAX_NUM_SEQS):
        work.submit()

    def refill() -> None:
        while driver.num_waiting < num_waiting:
            work.submit()

    # Warm up: fill the batch and get past the first wave of prefills.
    for _ in range(200):
        driver.step()
        refill()
    times: list[float] = []
    batch: list[int] = []
    for _ in range(steps):
        batch.append(driver.num_running)
        times.append(driver.step())
        refill()
    ordered = sorted(times)
    return {
        "num_waiting": num_waiting,
        "ms_per_step": statistics.fmean(times) * 1000,
        "p50_ms": ordered[len(ordered) // 2] * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "max_ms": ordered[-1] * 1000,
        "mean_running": statistics.fmean(batch),
        "steps": steps,
        "num_preemptions": driver.scheduler.num_preemptions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps (seconds)")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    parser.add_argument("--sizes", default="64,4096,16384", help="waiting-line lengths")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per cell")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    steps = args.steps or (50 if args.quick else 1000)

    results: dict[str, dict[int, dict[str, Any]]] = {"base": {}, "lora": {}}
    print(
        f"{'setting':<8}{'waiting':>9}{'ms/step':>10}{'p50 ms':>10}{'p99 ms':>10}"
        f"{'max ms':>10}{'batch':>8}"
    )
    for setting in ("base", "lora"):
        for n in sizes:
            r = measure(n, lora=setting == "lora", steps=steps, seed=args.seed)
            results[setting][n] = r
            print(
                f"{setting:<8}{n:>9}{r['ms_per_step']:>10.3f}{r['p50_ms']:>10.3f}"
                f"{r['p99_ms']:>10.3f}{r['max_ms']:>10.3f}{r['mean_running']:>8.1f}",
                flush=True,
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            # The goal's reading: the default engine (LoRA enabled: an adapter cache).
            "ms_per_step": {str(n): round(r["ms_per_step"], 4) for n, r in results["lora"].items()},
            "ms_per_step_base": {
                str(n): round(r["ms_per_step"], 4) for n, r in results["base"].items()
            },
            "cells": {k: {str(n): r for n, r in v.items()} for k, v in results.items()},
            "max_num_seqs": MAX_NUM_SEQS,
            "quick": args.quick,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Fairness and aging of the real scheduler under a flood (no model; `sched_driver.py` steps it).

Flood (`fixed`, `varied`): a heavy tenant sends 400 requests at step 0 and a light tenant 8 at
step 100, all at priority 0, prompts of 64 tokens. Step 100 is past `aging_steps`: the case
issue 14 measured, where aging had put every queued flood request a level above any newcomer.
The light tenant's outputs are 60 tokens; the flood's are 60 (`fixed`) or uniform 8..112
(`varied`, seeded; the same mean). Engine: `max_num_seqs=16`, `max_num_batched_tokens=2048`,
block size 16, `aging_steps=64`, a KV pool that never runs out. The light tenant's time to first
token is counted in engine steps (first-token step - arrival step), averaged over its 8
requests, under `priority` (the fair-share counter) and under `fcfs`; ratio = fcfs / priority.

With every seat held by the flood and no fair-share preemption, the best a light request can do
is the next free seat: with `fixed` outputs the flood runs in waves of 16 that finish together
every ~61 steps, so the light tenant waits for the end of the wave it arrived in.

Aging (`aging`): priority-0 newcomers arrive, 3 per step from 4 tenants, more than 16 seats
serve (outputs of 8 tokens, 16 per 8 steps); at step 32 one priority-4 request arrives. The
bound engine/scheduling/scheduler.py documents: after (p - q + 1) * aging_steps = 320 steps it outranks
every newcomer; from then on only the wave running and the requests waiting at that step can be
ahead of it. The benchmark records that backlog, computes the bound from it, and checks the
wait; the same run with aging off (aging_steps = 2**30) shows the request starved.

    python bench/fairness.py [--quick] [--json PATH]

`--quick`: a flood of 100 instead of 400 (the same keys; fewer waves behind, so smaller ratios).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sched_driver import Driver

from engine.config import EngineConfig, SchedulingPolicy

MAX_NUM_SEQS = 16
AGING_STEPS = 64
PROMPT_LEN = 64
LIGHT_OUTPUT = 60
LIGHT_ARRIVAL_STEP = 100


def flood(
    policy: SchedulingPolicy, *, varied: bool, num_heavy: int, num_light: int, seed: int
) -> dict[str, Any]:
    config = EngineConfig(
        model="unused", max_num_seqs=MAX_NUM_SEQS, aging_steps=AGING_STEPS, policy=policy
    )
    num_blocks = (num_heavy + num_light) * 12 + 64
    driver = Driver.create(config, num_blocks=num_blocks, seed=seed)
    rng = random.Random(seed)
    for i in range(num_heavy):
        output = rng.randint(8, 112) if varied else 60
        driver.submit(f"H{i}", prompt_len=PROMPT_LEN, max_tokens=output, tenant="heavy")
    light = [f"L{i}" for i in range(num_light)]
    steps = 0
    while any(name not in driver.first_token_step for name in light):
        if steps == LIGHT_ARRIVAL_STEP:
            for name in light:
                driver.submit(name, prompt_len=PROMPT_LEN, max_tokens=LIGHT_OUTPUT, tenant="light")
        driver.step()
        steps += 1
        if steps > 100_000:
            raise RuntimeError("the light tenant never started")
    ttfts = [driver.ttft_steps(name) for name in light]
    return {"mean_ttft_steps": statistics.fmean(ttfts), "max_ttft_steps": max(ttfts)}


def aging(*, aging_steps: int, max_steps: int, seed: int) -> dict[str, Any]:
    priority, newcomer_priority, per_step, output, arrive_at = 4, 0, 3, 8, 32
    config = EngineConfig(model="unused", max_num_seqs=MAX_NUM_SEQS, aging_steps=aging_steps)
    driver = Driver.create(config, num_blocks=(max_steps * per_step + 64) * 6, seed=seed)
    newcomer_bound = (priority - newcomer_priority + 1) * aging_steps
    backlog_at_bound: int | None = None
    count = waiting_at_arrival = 0
    while "old" not in driver.first_token_step and driver.scheduler.num_steps < max_steps:
        step = driver.scheduler.num_steps
        if step == arrive_at:
            driver.submit(
                "old", prompt_len=16, max_tokens=output, priority=priority, tenant="t-old"
            )
            waiting_at_arrival = driver.num_waiting - 1
        for _ in range(per_step):
            driver.submit(
                f"n{count}", prompt_len=16, max_tokens=output,
                priority=newcomer_priority, tenant=f"t{count % 4}",
            )  # fmt: skip
            count += 1
        if step == arrive_at + newcomer_bound:
            backlog_at_bound = driver.num_waiting - 1
        driver.step()
    wait = driver.ttft_steps("old") if "old" in driver.first_token_step else None
    bound = newcomer_bound if wait is not None and wait <= newcomer_bound else None
    if backlog_at_bound is not None:
        # A request holds a seat for `output` steps (its prefill step samples the first token):
        # the wave running at the bound, then the backlog, wave by wave.
        bound = newcomer_bound + (math.ceil(backlog_at_bound / MAX_NUM_SEQS) + 1) * output
    return {
        "priority": priority,
        "newcomer_priority": newcomer_priority,
        "aging_steps": aging_steps,
        "newcomers_per_step": per_step,
        "waiting_at_arrival": waiting_at_arrival,
        "wait_steps": wait,
        "newcomer_bound_steps": newcomer_bound,
        "backlog_at_bound": backlog_at_bound,
        "bound_steps": bound,
        "within_bound": wait is not None and bound is not None and wait <= bound,
        "steps_run": driver.scheduler.num_steps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller flood (seconds)")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    num_heavy = 100 if args.quick else 400

    cells: dict[str, dict[str, Any]] = {}
    ratios: dict[str, float] = {}
    print(f"{'flood outputs':<15}{'policy':<10}{'light TTFT (steps)':>20}{'max':>8}")
    for name in ("fixed", "varied"):
        cells[name] = {}
        for policy in ("fcfs", "priority"):
            r = flood(policy, varied=name == "varied", num_heavy=num_heavy, num_light=8,
                      seed=args.seed)  # fmt: skip
            cells[name][policy] = r
            print(f"{name:<15}{policy:<10}{r['mean_ttft_steps']:>20.1f}{r['max_ttft_steps']:>8}")
        ratios[name] = cells[name]["fcfs"]["mean_ttft_steps"] / max(
            cells[name]["priority"]["mean_ttft_steps"], 1e-9
        )
    for name, ratio in ratios.items():
        print(f"light-tenant TTFT, fcfs / priority ({name}): {ratio:.1f}x")

    aged = aging(aging_steps=AGING_STEPS, max_steps=4000, seed=args.seed)
    unaged = aging(aging_steps=1 << 30, max_steps=aged["steps_run"] * 2 + 64, seed=args.seed)
    print(
        f"aging: a priority-{aged['priority']} request under {aged['newcomers_per_step']} "
        f"priority-{aged['newcomer_priority']} newcomers/step waited {aged['wait_steps']} steps; "
        f"bound {aged['bound_steps']} = {aged['newcomer_bound_steps']} + drain of "
        f"{aged['backlog_at_bound']} waiting at that step ({'held' if aged['within_bound'] else 'BROKEN'}); "
        f"without aging: {'not started after ' + str(unaged['steps_run']) + ' steps' if unaged['wait_steps'] is None else str(unaged['wait_steps']) + ' steps'}"
    )  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "ttft_ratio_vs_fcfs": {k: round(v, 2) for k, v in ratios.items()},
            "light_ttft_steps": cells,
            "aging": aged,
            "aging_disabled": unaged,
            "num_heavy": num_heavy,
            "max_num_seqs": MAX_NUM_SEQS,
            "quick": args.quick,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if aged["within_bound"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

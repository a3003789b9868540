"""The compile stall alone (bench/structured_stall.py), this checkout against another, interleaved.

    git worktree add /tmp/before <commit>
    flock /tmp/loragate-bench.lock python bench/compile_stall.py --baseline-src /tmp/before \
        --json bench/out/compile_stall.json

bench/structured.py measures the stall once, after its throughput rounds; a change to how a
compile shares the machine with the steps needs the stall alone, several times, beside the code
before it: one stall varies from run to run by how the compile's start meets a step. Each round
measures it once per tree and arrival, each in a fresh process running that tree's engine (first
on PYTHONPATH) under this checkout's bench helpers, alternating which tree goes first. Arrivals
(`--arrivals`): the compile asked for between two steps (0, as bench/structured.py does) and in
the middle of one (0.5). Each cell also times as many steps with no compile (`noise_stall_ms`:
the same figure's floor on this machine, the slowest of that many steps). Prints each cell's
rounds and medians, and each tree's worst arrival against the goal; without --baseline-src, this
checkout alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from plan import ensure_model
from report import load_average, write_record

HERE = Path(__file__).resolve().parent
FIGURES = ("compile_stall_ms", "noise_stall_ms", "step_ms_median", "step_ms_max_before",
           "step_ms_median_during", "step_ms_max_during", "compile_s", "compile_s_idle")  # fmt: skip
GOAL = "goal: compile_stall_ms < step_ms_median"


def measure_here(model_dir: Path, dtype: str, threads: int, arrival: float) -> dict[str, Any]:
    """One stall in this process (the --cell mode), without the per-step lists."""
    import torch
    from plan import WARMUP
    from structured_engine import Chat
    from structured_stall import measure_compile_stall
    from workload import make_workload, token_pool

    torch.set_num_threads(threads)
    warmup = make_workload(WARMUP, token_pool(model_dir))
    stall = measure_compile_stall(model_dir, dtype, Chat(model_dir).render, warmup, arrival=arrival)
    return {k: v for k, v in stall.items() if k != "steps_ms"}


def run_cell(tree: Path, arrival: float, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, str(HERE / "compile_stall.py"), "--cell",
               "--model", str(args.model.resolve()), "--dtype", args.dtype,
               "--threads", str(args.threads), "--arrivals", str(arrival)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(HERE)])}
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the stall on {tree} failed:\n{done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, default=None, help="the checkout before")
    parser.add_argument("--model", type=Path, default=Path(".cache/models/small"))
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--arrivals", default="0,0.5", help="when the compile is asked for, in median steps"
    )
    parser.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    arrivals = [float(a) for a in args.arrivals.split(",") if a]
    if args.cell:
        print(json.dumps(measure_here(args.model, args.dtype, args.threads, arrivals[0])))
        return 0
    args.quick = False  # recorded by write_record
    ensure_model(args.model, "small")
    trees = {"head": HERE.parent}
    if args.baseline_src is not None:
        trees["base"] = args.baseline_src.resolve()
    started = datetime.datetime.now().astimezone()
    load_start = load_average()
    cells = [(name, arrival) for name in trees for arrival in arrivals]
    rounds: dict[tuple[str, float], list[dict[str, Any]]] = {cell: [] for cell in cells}
    for r in range(args.rounds):
        for name, arrival in cells if r % 2 == 0 else list(reversed(cells)):
            fig = run_cell(trees[name], arrival, args)
            rounds[name, arrival].append(fig)
            print(f"round {r + 1} {name}, arrival {arrival:g}: stall "
                  f"{fig['compile_stall_ms']:.1f} ms over a {fig['step_ms_median']:.1f} ms step "
                  f"(during: median {fig['step_ms_median_during']:.1f}, max "
                  f"{fig['step_ms_max_during']:.1f}; compile {fig['compile_s']:.2f} s; "
                  f"no compile, {fig['num_steps_control']} steps: {fig['noise_stall_ms']:.1f} ms)",
                  flush=True)  # fmt: skip
    medians = {
        cell: {k: statistics.median(f[k] for f in figs) for k in FIGURES}
        for cell, figs in rounds.items()
    }
    for (name, arrival), m in medians.items():
        print(f"{name}, arrival {arrival:g}: median stall {m['compile_stall_ms']:.1f} ms over a "
              f"median step of {m['step_ms_median']:.1f} ms (no compile: "
              f"{m['noise_stall_ms']:.1f} ms); compile {m['compile_s']:.2f} s "
              f"(idle {m['compile_s_idle']:.2f} s)")  # fmt: skip
    worst = {
        name: max((medians[name, a] for a in arrivals), key=lambda m: m["compile_stall_ms"])
        for name in trees
    }
    for name, m in worst.items():
        print(f"{name}, worst arrival: stall {m['compile_stall_ms']:.1f} ms, "
              f"{m['compile_stall_ms'] / m['step_ms_median']:.2f} steps")  # fmt: skip
    print(GOAL)
    if args.json is not None:
        key = lambda cell: f"{cell[0]}@{cell[1]:g}"  # noqa: E731
        record = {"trees": {k: str(v) for k, v in trees.items()}, "arrivals": arrivals,
                  "compile_stall_ms": {k: m["compile_stall_ms"] for k, m in worst.items()},
                  "medians": {key(c): m for c, m in medians.items()},
                  "rounds": {key(c): figs for c, figs in rounds.items()}, "goal": GOAL}  # fmt: skip
        write_record(args.json, record, args, model_dir=args.model, started=started,
                     load_start=load_start, load_end=load_average())  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

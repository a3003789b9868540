"""This checkout's engine against another checkout's (before a change), interleaved, one run.

    git worktree add /tmp/before <commit>
    python bench/source_ab.py --baseline-src /tmp/before --json bench/out/source_ab.json

For a change that must leave speed alone (a refactor): each round runs every cell once on each
tree, each in a fresh process (bench/source_ab_cell.py with that tree's code and bench helpers),
alternating which tree goes first. Cells: the engine throughput bench's mixed workload
(`engine`), the LoRA bench's (a) on the base model and over 8 adapters (`lora-base`, `lora`).
Prints per cell the median tok/s (wall and CPU) of each tree, their ratio (head / base, above 1:
this checkout faster) and each tree's spread across rounds, the noise a ratio is read against.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

from plan import ensure_model
from report import load_average, write_record

HERE = Path(__file__).resolve().parent
CELLS = ("engine", "lora-base", "lora")


def run_cell(tree: Path, cell: str, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, str(HERE / "source_ab_cell.py"), "--tree", str(tree),
               "--cell", cell, "--model", str(args.model.resolve()), "--dtype", args.dtype,
               "--threads", str(args.threads),
               "--adapter-dir", str(args.adapter_dir.resolve())]  # fmt: skip
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{cell} on {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, required=True, help="the checkout before")
    parser.add_argument("--model", type=Path, default=Path(".cache/models/small"))
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cells", default=",".join(CELLS), help=f"some of {CELLS}")
    parser.add_argument("--adapter-dir", type=Path, default=Path(".cache/lora_bench/small"))
    args = parser.parse_args(argv)
    args.quick = False  # recorded by write_record: the full workloads only
    cells = [c for c in args.cells.split(",") if c]
    if unknown := set(cells) - set(CELLS):
        raise SystemExit(f"--cells: unknown {sorted(unknown)}; choose from {CELLS}")
    ensure_model(args.model, "small")
    trees = {"base": args.baseline_src.resolve(), "head": HERE.parent}
    started = datetime.datetime.now().astimezone()
    load_start = load_average()
    print(f"base {trees['base']}, head {trees['head']}; {args.rounds} rounds, threads "
          f"{args.threads}, dtype {args.dtype}, load {load_start}", flush=True)  # fmt: skip
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        c: {"base": [], "head": []} for c in cells
    }
    for i in range(args.rounds):
        order = ("base", "head") if i % 2 == 0 else ("head", "base")
        for cell in cells:
            for side in order:
                r = run_cell(trees[side], cell, args)
                runs[cell][side].append(r)
                print(f"  round {i + 1} {cell:9s} {side}: {r['tokens'] / r['wall_s']:.1f} tok/s, "
                      f"{r['tokens'] / r['cpu_s']:.1f} tok/cpu-s", flush=True)  # fmt: skip
    summary: dict[str, dict[str, float]] = {}
    print()
    for cell in cells:
        row: dict[str, float] = {}
        for clock in ("wall_s", "cpu_s"):
            rates = {s: [r["tokens"] / r[clock] for r in runs[cell][s]] for s in ("base", "head")}
            med = {s: statistics.median(v) for s, v in rates.items()}
            spread = {s: (max(v) - min(v)) / med[s] for s, v in rates.items()}
            key = "wall" if clock == "wall_s" else "cpu"
            row |= {f"base_{key}": med["base"], f"head_{key}": med["head"],
                    f"ratio_{key}": med["head"] / med["base"],
                    f"spread_base_{key}": spread["base"], f"spread_head_{key}": spread["head"]}  # fmt: skip
        summary[cell] = row
        print(f"{cell:9s} head / base {row['ratio_wall']:.3f}x wall ({row['head_wall']:.1f} vs "
              f"{row['base_wall']:.1f} tok/s), {row['ratio_cpu']:.3f}x cpu; spread across rounds "
              f"base {100 * row['spread_base_wall']:.1f}%, head {100 * row['spread_head_wall']:.1f}%")  # fmt: skip
    load_end = load_average()
    if args.json is not None:
        record = {"ratios": {c: summary[c]["ratio_wall"] for c in cells}, "cells": summary,
                  "runs": runs, "trees": {k: str(v) for k, v in trees.items()}}  # fmt: skip
        write_record(args.json, record, args, model_dir=args.model, started=started,
                     load_start=load_start, load_end=load_end)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A step's matmuls at 1 to 512 rows: oneDNN's packed matmul against loragate's kernel.

    python bench/native_matmul.py --model .cache/models/small --json bench/out/native_matmul.json

Every linear of the model (the projections of each layer and the lm_head), packed as the engine
packs them, run once each as a step runs them (each weight distinct, so at a few rows each
streams from memory): through `mkldnn::_linear_pointwise` (oneDNN, what PyTorch and vLLM's CPU
backend run) and through kernels/cpu/native/matmul.cpp (engine/step/native_matmul.py: the engine's choice
where a start-up timing finds it as fast). Rounds interleave the two; the median of the rounds
is reported, with the weight bytes and FLOP/s over that time. Needs a CPU where the kernel has
the dtype's instructions; elsewhere it says so and exits 0 without rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from plan import ensure_model
from report import machine_info

from engine.loop.llm_engine import LLMEngine
from engine.settings import EngineSettings
from engine.step.native_matmul import matmul_steps
from engine.step.packed_linear import PackedLinear, can_pack, pack_linears
from kernels.cpu.matmul import native_matmul

ROWS = (1, 2, 4, 8, 64, 512)
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".cache/models/small"))
    parser.add_argument("--threads", type=int, default=None, help="default: every core")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument(
        "--dtype", choices=[*_DTYPES, "both"], default="bfloat16", help="both: each in turn"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    model_dir = ensure_model(args.model, "tiny" if args.quick else "small")
    names = list(_DTYPES) if args.dtype == "both" else [args.dtype]
    records = {}
    for name in names:
        if not native_matmul().takes(_DTYPES[name]):
            print(f"{name}: this CPU lacks the kernel's instructions for it; nothing to compare")
            continue
        records[name] = run_dtype(model_dir, name, args.threads, rounds)
    if args.json is not None and records:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        # the first dtype's figures at the top level (the keys earlier runs wrote), every one
        # under "dtypes"
        record = {**next(iter(records.values())), "dtypes": records, "machine": machine_info()}
        args.json.write_text(json.dumps(record, indent=2))
        print(f"wrote {args.json}")
    return 0


def run_dtype(model_dir: Path, name: str, threads: int | None, rounds: int) -> dict[str, object]:
    dtype = _DTYPES[name]
    settings = EngineSettings(dtype=name, threads=threads, native_matmul="off")
    engine = LLMEngine(settings.to_engine_config(model=str(model_dir)))
    model = engine.runner.model
    if not any(isinstance(m, PackedLinear) for m in model.modules()):
        # not packed by the engine (no oneDNN kernels for the dtype, or packing did not pay):
        # wrapped here so both paths run on the same weights
        pack_linears(model, onednn=can_pack(dtype, torch.device("cpu")))
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    reference = "oneDNN" if linears[0].onednn else "F.linear"
    for m in linears:  # both copies: the engine would keep one where the kernel takes every row
        m.use_native(native_matmul(), max_rows=0)
    weight_bytes = sum(m.in_features * m.out_features * dtype.itemsize for m in linears)
    print(
        f"\n{name}: {len(linears)} matmuls, {weight_bytes / 1e6:.1f} MB of weights, "
        f"{torch.get_num_threads()} thread(s), {rounds} rounds, reference {reference}"
    )

    results: dict[str, dict[str, float]] = {"onednn": {}, "kernel": {}}
    for rows in ROWS:
        onednn, kernel = matmul_steps(linears, rows)
        times: dict[str, list[float]] = {"onednn": [], "kernel": []}
        onednn(), kernel()  # first calls: oneDNN builds its kernels
        for _ in range(rounds):
            for key, run in (("onednn", onednn), ("kernel", kernel)):
                start = time.perf_counter()
                run()
                times[key].append(time.perf_counter() - start)
        for key in times:
            results[key][str(rows)] = statistics.median(times[key]) * 1e3

    header = f"{'rows':>4}  {reference + ' ms':>10}  {'kernel ms':>10}  {'GB/s (ref / kernel)':>24}"
    print(f"{header}  {'GFLOP/s (ref / kernel)':>26}  ratio")
    ratios = {}
    for rows in ROWS:
        a, b = results["onednn"][str(rows)], results["kernel"][str(rows)]
        ratios[str(rows)] = a / b
        rates = f"{weight_bytes / a / 1e6:.1f} / {weight_bytes / b / 1e6:.1f}"
        flops = 2 * rows * weight_bytes / dtype.itemsize  # 2 FLOPs a weight a row
        gflops = f"{flops / a / 1e6:.0f} / {flops / b / 1e6:.0f}"
        print(f"{rows:>4}  {a:>10.2f}  {b:>10.2f}  {rates:>24}  {gflops:>26}  {a / b:.2f}x")
    return {
        "ms_per_step": results,
        "ratios": ratios,
        "reference": reference,
        "weight_bytes": weight_bytes,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
    }


if __name__ == "__main__":
    raise SystemExit(main())

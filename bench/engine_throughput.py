"""Useful output tokens/s of the loragate engine vs transformers `generate`, in one run.

    python bench/engine_throughput.py --model .cache/models/small --json bench/out/x.json
    python bench/engine_throughput.py --quick --model .cache/models/tiny

Per workload (mixed lengths, then equal lengths): the engine with every request submitted at
once, then transformers `generate` at each static batch size. Then the engine alone in a
batch-64 decode-heavy run, whose model FLOP/s over the measured matmul peak is the MFU.
See bench/README.md for the method and bench/RESULTS.md for recorded numbers.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import engine_run
import hf_baseline
import torch
from flops import FlopCount, FlopModel, MatmulPeak, measure_matmul_peak
from measurement import SystemResult
from plan import FULL, QUICK, WARMUP, Plan, ensure_model
from report import Row, format_table, load_average, write_record
from workload import BenchRequest, WorkloadSpec, make_workload, summarize, token_pool

from engine.models.hf_config import load_model_config

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".cache/models/small"))
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="reduced workload, under a minute")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")
    # One intra-op thread by default: on a shared 2-core box a second OpenMP thread that gets
    # descheduled makes every op wait at the barrier (runs here went 5-10x slower, and quick
    # took minutes). Use --threads N on a dedicated machine; both systems get the same N.
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    return parser.parse_args(argv)


def run_workload(
    model_dir: Path,
    args: argparse.Namespace,
    plan: Plan,
    hf_model: Any,
    spec: WorkloadSpec,
    requests: list[BenchRequest],
    warmup: list[BenchRequest],
) -> tuple[engine_run.EngineRun, engine_run.EngineSettings, list[SystemResult]]:
    settings = engine_run.EngineSettings(
        max_num_seqs=args.max_num_seqs or plan.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens or plan.max_num_batched_tokens,
        num_kv_blocks=engine_run.kv_blocks_for(requests, block_size=16),
    )
    engine = engine_run.build_engine(model_dir, args.dtype, settings)
    engine_run.warm_up(engine, warmup)
    run = engine_run.run_engine(engine, requests, settings, spec.name)
    del engine  # its KV cache is freed before transformers allocates its own
    print(f"  loragate {settings}: {run.result.tokens_per_s:.1f} tok/s", flush=True)
    hf_results = []
    for batch_size, num_requests in plan.hf_requests:
        hf_settings = hf_baseline.HFSettings(batch_size, num_requests)
        result = hf_baseline.run_hf(hf_model, requests, hf_settings, pad_id=0)
        print(f"  transformers batch {batch_size}: {result.tokens_per_s:.1f} tok/s", flush=True)
        hf_results.append(result)
    return run, settings, hf_results


def run_decode(
    model_dir: Path,
    args: argparse.Namespace,
    plan: Plan,
    requests: list[BenchRequest],
    warmup: list[BenchRequest],
) -> engine_run.DecodePhase:
    # Every prompt prefills in the first step, so all sequences then decode in lockstep and
    # every timed step is a full batch (chunked prefill would stagger their finishes).
    settings = engine_run.EngineSettings(
        max_num_seqs=plan.decode_batch,
        max_num_batched_tokens=sum(r.num_prompt_tokens for r in requests),
        num_kv_blocks=engine_run.kv_blocks_for(requests, block_size=16),
    )
    engine = engine_run.build_engine(model_dir, args.dtype, settings)
    engine_run.warm_up(engine, warmup)
    return engine_run.run_decode_phase(engine, requests, settings, plan.decode_workload.name)


def mfu_report(phase: engine_run.DecodePhase, model: FlopModel, peak: MatmulPeak) -> dict[str, Any]:
    flops = phase.flops.flops(model)
    flops_2n = 2.0 * model.non_embedding_params * phase.flops.num_tokens
    return {
        "mfu": flops / phase.elapsed_s / peak.flops_per_s,
        "mfu_2n": flops_2n / phase.elapsed_s / peak.flops_per_s,
        "achieved_flops_per_s": flops / phase.elapsed_s,
        "decode_steps": phase.num_steps,
        "decode_elapsed_s": phase.elapsed_s,
        "decode_tokens": phase.flops.num_tokens,
        "engine_settings": asdict(phase.settings),
        "batch_size_min": min(phase.batch_sizes),
        "batch_size_max": max(phase.batch_sizes),
        "flop_model": asdict(model),
        "counting": (
            "mfu: 2 x decoder-layer weights per token + 2 x lm_head weights per sampled token "
            "+ attention (QK^T and PV, 4 x heads x head_dim x layers per causal query-key pair); "
            "mfu_2n: 2 x non-embedding params (lm_head included) per token, no attention"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    torch.set_num_threads(args.threads)
    started = datetime.datetime.now().astimezone()
    load_start = load_average()
    model_dir = ensure_model(args.model, plan.model_size)
    dtype = _DTYPES[args.dtype]
    print(f"threads {args.threads}, dtype {args.dtype}, load average {load_start}", flush=True)
    _warn_if_busy(load_start[0], args.threads)

    peak = measure_matmul_peak(dtype, plan.matmul_sizes)
    print(f"matmul peak {peak.flops_per_s / 1e12:.3f} TFLOP/s (n={peak.size})", flush=True)

    pool = token_pool(model_dir)
    hf_model = hf_baseline.load_hf_model(model_dir, dtype)
    warmup = make_workload(WARMUP, pool)
    hf_baseline.warm_up(hf_model, warmup, pad_id=0)
    flop_model = FlopModel.from_config(load_model_config(str(model_dir)))
    cells: dict[str, Any] = {}
    rows: list[Row] = []
    ratios: dict[str, float] = {}
    for spec in plan.workloads:
        requests = make_workload(spec, pool)
        print(f"workload {spec.name}: {summarize(requests)}", flush=True)
        run, settings, hf_results = run_workload(
            model_dir, args, plan, hf_model, spec, requests, warmup
        )
        best = max(hf_results, key=lambda r: r.tokens_per_s)
        ratio = run.result.tokens_per_s / best.tokens_per_s
        ratios["vs_transformers" if spec.name == "mixed" else f"vs_transformers_{spec.name}"] = (
            ratio
        )
        rows.append(_row(spec.name, run.result, best, f"max_num_seqs={settings.max_num_seqs}"))
        rows.extend(_row(spec.name, r, best, str(r.batch_size)) for r in hf_results)
        cells[spec.name] = {
            "spec": asdict(spec),
            "summary": summarize(requests),
            "loragate": {
                **run.result.to_json(),
                "settings": asdict(settings),
                "num_steps": run.num_steps,
                "num_cached_tokens": run.num_cached_tokens,
                "num_preemptions": run.num_preemptions,
                # The whole run's useful model FLOP/s over the peak (prefill included).
                "mfu": _workload_flops(requests, flop_model)
                / run.result.elapsed_s
                / peak.flops_per_s,
            },
            "transformers": [r.to_json() for r in hf_results],
            "best_transformers_batch": best.batch_size,
        }
    del hf_model

    decode_requests = make_workload(plan.decode_workload, pool)
    phase = run_decode(model_dir, args, plan, decode_requests, warmup)
    mfu = mfu_report(phase, flop_model, peak)

    print()
    print(format_table(rows))
    print(
        f"\nloragate vs best transformers (mixed): {ratios['vs_transformers']:.2f}x  (goal >= 2x)"
    )
    print(
        f"matmul peak {peak.flops_per_s / 1e12:.3f} TFLOP/s; engine decode at batch "
        f"{plan.decode_batch}: {mfu['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s, "
        f"MFU {mfu['mfu']:.3f} (2N count: {mfu['mfu_2n']:.3f})"
    )
    load_end = load_average()
    print(f"load average at start {load_start}, at end {load_end}")
    if args.json is not None:
        record = {
            "ratios": ratios,
            "mfu": mfu["mfu"],
            "mfu_detail": mfu,
            "matmul_peak": asdict(peak),
            "workloads": cells,
            "table": [asdict(r) for r in rows],
        }
        write_record(
            args.json,
            record,
            args,
            model_dir=model_dir,
            started=started,
            load_start=load_start,
            load_end=load_end,
        )
    return 0


def _workload_flops(requests: list[BenchRequest], model: FlopModel) -> float:
    count = FlopCount()
    for r in requests:
        count.add_request(r.num_prompt_tokens, r.num_output_tokens)
    return count.flops(model)


def _warn_if_busy(load: float, threads: int) -> None:
    num_cpus = os.cpu_count() or 1
    if load <= 0.5:
        return
    print(f"warning: load average {load:.2f} on {num_cpus} CPUs: other work is running and the")
    print("  numbers will be noisy", end="")
    if threads > 1:
        print("; with --threads > 1 they can be several times slower", end="")
    print(flush=True)


def _row(workload: str, result: SystemResult, best: SystemResult, batch: str) -> Row:
    requests = str(result.num_requests)
    if result.is_subsampled:
        requests = f"first {result.num_requests} of {result.num_requests_total}"
    if result.batch_size > result.num_requests:
        batch = f"{batch} (holds all {result.num_requests})"
    return Row(
        workload,
        result.system,
        batch,
        requests,
        result.tokens_per_s,
        result.tokens_per_s / best.tokens_per_s,
    )


if __name__ == "__main__":
    sys.exit(main())

"""Useful output tokens/s of the loragate engine vs vLLM and transformers `generate`, in one run.

    python bench/engine_throughput.py --model .cache/models/small --json bench/out/x.json
    python bench/engine_throughput.py --quick --model .cache/models/tiny --dtype both

Per dtype and workload (mixed lengths, then equal lengths): rounds in which the engine and
vLLM (offline `LLM`, compiled and eager, from the vLLM venv; `vllm_offline.py`) each run the
whole workload, every request submitted at once, in rotating order; then transformers
`generate` at each static batch size. Then the engine alone in a batch-64 decode-heavy run,
whose model FLOP/s over the measured matmul peak is the MFU. With `--dtype both` the top-level
ratios compare each system's best dtype. See bench/README.md for the method and
bench/RESULTS.md for recorded numbers.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import dtype_ratios
import engine_run
import hf_baseline
import torch
import vllm_offline
from flops import FlopCount, FlopModel, MatmulPeak, measure_matmul_peak
from measurement import SystemResult
from plan import FULL, QUICK, WARMUP, Plan, ensure_model
from report import Row, format_table, load_average, system_row, warn_if_busy, write_record
from workload import BenchRequest, make_workload, summarize, token_pool

from engine.models.hf_config import load_model_config
from kernels.cpu import onednn

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
T = TypeVar("T")
OUT_DIR = Path(__file__).resolve().parent / "out"  # vLLM logs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".cache/models/small"))
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="reduced workload, under a minute")
    parser.add_argument(
        "--dtype", choices=[*sorted(_DTYPES), "both"], default="bfloat16", help="both: each in turn"
    )
    # One intra-op thread by default: on a shared 2-core box a second OpenMP thread that gets
    # descheduled makes every op wait at the barrier (runs here went 5-10x slower, and quick
    # took minutes). Use --threads N on a dedicated machine; both systems get the same N.
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument(
        "--vllm",
        choices=["auto", "off", "required"],
        default="auto",
        help="auto: vLLM rows when its venv exists (else say why); required: fail without it",
    )
    parser.add_argument("--vllm-modes", default="compiled,eager", help="compiled and/or eager")
    # Where the peers' best dtype is not loragate's (an AVX2 CPU: oneDNN has no bf16 kernels,
    # so vLLM and transformers run float32 several times faster than bf16), this runs them in
    # that dtype inside each block, interleaved with loragate in the block's own dtype.
    parser.add_argument(
        "--baseline-dtype",
        choices=["same", *sorted(_DTYPES)],
        default="same",
        help="the dtype vLLM and transformers run in (same: each block's)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per workload")
    return parser.parse_args(argv)


@dataclass(frozen=True)
class WorkloadRuns:
    loragate: engine_run.EngineRun  # the median round
    settings: engine_run.EngineSettings
    vllm: dict[str, SystemResult]  # mode -> the median round
    rounds: dict[str, list[float]]  # system -> tokens/s of each round, in run order
    transformers: list[SystemResult]


def run_workload(
    model_dir: Path,
    args: argparse.Namespace,
    plan: Plan,
    dtype: str,
    hf_model: Any,
    requests: list[BenchRequest],
    warmup: list[BenchRequest],
    vllm: dict[str, vllm_offline.VllmWorker],
    label: str,
) -> WorkloadRuns:
    settings = engine_run.EngineSettings(
        max_num_seqs=args.max_num_seqs or plan.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens or plan.max_num_batched_tokens,
        num_kv_blocks=engine_run.kv_blocks_for(requests, block_size=16),
    )
    # Rounds in rotating order, so drift in the machine's speed (other work, thermal, the
    # host) falls on every system alike; the median round of each counts.
    systems = ["loragate", *(f"vllm-{mode}" for mode in vllm)]
    ours: list[engine_run.EngineRun] = []
    theirs: dict[str, list[SystemResult]] = {name: [] for name in systems[1:]}
    for r in range(args.rounds or (1 if args.quick else 3)):
        shift = r % len(systems)
        for name in systems[shift:] + systems[:shift]:
            if name == "loragate":
                engine = engine_run.build_engine(model_dir, dtype, settings)
                engine_run.warm_up(engine, warmup)
                ours.append(engine_run.run_engine(engine, requests, settings, label))
                del engine  # its KV cache is freed before anything else allocates its own
                result = ours[-1].result
            else:
                run = vllm[name.removeprefix("vllm-")].run(requests)
                result = SystemResult(
                    system=name,
                    batch_size=settings.max_num_seqs,
                    num_requests=len(requests),
                    num_requests_total=len(requests),
                    num_useful_tokens=run.num_tokens,
                    num_generated_tokens=run.num_tokens,
                    elapsed_s=run.elapsed_s,
                )
                theirs[name].append(result)
            print(f"  round {r} {name}: {result.tokens_per_s:.1f} tok/s", flush=True)
    hf_results = []
    for batch_size, num_requests in plan.hf_requests:
        hf_settings = hf_baseline.HFSettings(batch_size, num_requests)
        result = hf_baseline.run_hf(hf_model, requests, hf_settings, pad_id=0)
        print(f"  transformers batch {batch_size}: {result.tokens_per_s:.1f} tok/s", flush=True)
        hf_results.append(result)
    return WorkloadRuns(
        loragate=_median(ours, lambda run: run.result.tokens_per_s),
        settings=settings,
        vllm={name: _median(runs, lambda x: x.tokens_per_s) for name, runs in theirs.items()},
        rounds={
            "loragate": [run.result.tokens_per_s for run in ours],
            **{name: [x.tokens_per_s for x in runs] for name, runs in theirs.items()},
        },
        transformers=hf_results,
    )


def _median(items: list[T], key: Callable[[T], float]) -> T:
    """The item with the median key (the lower middle one of an even count)."""
    middle = statistics.median_low(key(x) for x in items)
    return next(x for x in items if key(x) == middle)


def vllm_settings(
    args: argparse.Namespace, plan: Plan, model_dir: Path, dtype: str
) -> list[vllm_offline.VllmSettings]:
    """vLLM with the engine's batch limits; the KV cache fits every workload's busiest moment
    (max_num_seqs of its longest requests), so neither system preempts."""
    max_num_seqs = args.max_num_seqs or plan.max_num_seqs
    lengths = [
        spec.prompt_len[1] + spec.output_len[1] for spec in (*plan.workloads, plan.decode_workload)
    ]
    num_tokens = max(min(spec.num_requests, max_num_seqs) * n for spec, n in zip(
        (*plan.workloads, plan.decode_workload), lengths, strict=True))  # fmt: skip
    return [
        vllm_offline.VllmSettings(
            mode=mode,
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens or plan.max_num_batched_tokens,
            max_model_len=max(lengths),
            kv_cache_gib=vllm_offline.kv_cache_gib(model_dir, dtype, num_tokens),
        )
        for mode in args.vllm_modes.split(",")
        if mode
    ]


def run_decode(
    model_dir: Path,
    dtype: str,
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
    engine = engine_run.build_engine(model_dir, dtype, settings)
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


def measure(
    args: argparse.Namespace, plan: Plan, model_dir: Path, pool: list[int], dtype: str
) -> dict[str, Any]:
    """Everything of one dtype: matmul peak, the workloads (loragate, vLLM, transformers), MFU."""
    torch_dtype = _DTYPES[dtype]
    baseline = dtype if args.baseline_dtype == "same" else args.baseline_dtype
    print(f"dtype {dtype}" + ("" if baseline == dtype else f" (vLLM, transformers: {baseline})"),
          flush=True)  # fmt: skip
    # Where oneDNN has no bf16 kernels (AVX2), PyTorch's bf16 matmul is a slow fallback loop
    # (minutes at n = 4096) and the engine's bf16 matmuls run on float32 FMAs
    # (kernels/cpu/native/fma_tile.h): float32's peak is the machine's there.
    peak_dtype = torch_dtype
    if torch_dtype is torch.bfloat16 and not onednn.has_bf16():
        peak_dtype = torch.float32
    peak = measure_matmul_peak(peak_dtype, plan.matmul_sizes)
    print(f"matmul peak {peak.flops_per_s / 1e12:.3f} TFLOP/s (n={peak.size}, "
          f"{str(peak_dtype).removeprefix('torch.')})", flush=True)  # fmt: skip
    vllm: dict[str, vllm_offline.VllmWorker] = {}
    vllm_setups = vllm_settings(args, plan, model_dir, baseline) if args.vllm != "off" else []
    if args.vllm == "required" and vllm_offline.vllm_python() is None:
        raise SystemExit(vllm_offline.missing_reason())
    warmup = make_workload(WARMUP, pool)
    try:
        vllm = vllm_offline.start_workers(model_dir, vllm_setups, OUT_DIR)
        for worker in vllm.values():  # the same short warm-up as the engine's
            worker.run(warmup)
        hf_model = hf_baseline.load_hf_model(model_dir, _DTYPES[baseline])
        hf_baseline.warm_up(hf_model, warmup, pad_id=0)
        flop_model = FlopModel.from_config(load_model_config(str(model_dir)))
        cells: dict[str, Any] = {}
        rows: list[Row] = []
        tokens_per_s: dict[str, dict[str, float]] = {}  # workload -> system -> median tok/s
        for spec in plan.workloads:
            requests = make_workload(spec, pool)
            print(f"workload {spec.name}: {summarize(requests)}", flush=True)
            runs = run_workload(
                model_dir, args, plan, dtype, hf_model, requests, warmup, vllm, spec.name
            )
            run, settings = runs.loragate, runs.settings
            best = max(runs.transformers, key=lambda r: r.tokens_per_s)
            tokens_per_s[spec.name] = {
                "loragate": run.result.tokens_per_s,
                "transformers": best.tokens_per_s,
                **{name: r.tokens_per_s for name, r in runs.vllm.items()},
            }
            num_rounds = len(runs.rounds["loragate"])
            rows.append(system_row(spec.name, run.result, best,
                             f"max_num_seqs={settings.max_num_seqs}", num_rounds))  # fmt: skip
            rows.extend(
                system_row(spec.name, r, best, f"max_num_seqs={r.batch_size}", num_rounds)
                for r in runs.vllm.values()
            )
            rows.extend(
                system_row(spec.name, r, best, str(r.batch_size)) for r in runs.transformers
            )
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
                "vllm": {name: r.to_json() for name, r in runs.vllm.items()},
                "rounds_tokens_per_s": runs.rounds,
                "transformers": [r.to_json() for r in runs.transformers],
                "best_transformers_batch": best.batch_size,
            }
        del hf_model
    finally:
        for worker in vllm.values():
            worker.close()
    decode_requests = make_workload(plan.decode_workload, pool)
    phase = run_decode(model_dir, dtype, plan, decode_requests, warmup)
    mfu = mfu_report(phase, flop_model, peak)
    print(
        f"matmul peak {peak.flops_per_s / 1e12:.3f} TFLOP/s; engine decode at batch "
        f"{plan.decode_batch}: {mfu['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s, "
        f"MFU {mfu['mfu']:.3f} (2N count: {mfu['mfu_2n']:.3f})",
        flush=True,
    )
    return {
        "ratios": dtype_ratios.ratios(tokens_per_s),
        "baseline_dtype": baseline,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu["mfu"],
        "mfu_detail": mfu,
        "matmul_peak": asdict(peak),
        "workloads": cells,
        "table": [asdict(r) for r in rows],
        "vllm_settings": [asdict(w.settings) for w in vllm.values()],
        "vllm_load_s": {mode: w.load_s for mode, w in vllm.items()},
        "_rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    torch.set_num_threads(args.threads)
    cores = vllm_offline.share_cores(args.threads)
    started = datetime.datetime.now().astimezone()
    load_start = load_average()
    model_dir = ensure_model(args.model, plan.model_size)
    dtypes = sorted(_DTYPES, key=list(_DTYPES).index) if args.dtype == "both" else [args.dtype]
    print(f"threads {args.threads} on cores {cores}, dtypes {dtypes}, "
          f"load average {load_start}", flush=True)  # fmt: skip
    warn_if_busy(load_start[0], args.threads)

    pool = token_pool(model_dir)
    by_dtype = {dtype: measure(args, plan, model_dir, pool, dtype) for dtype in dtypes}
    top = dtype_ratios.best_of(by_dtype)  # each system at its best dtype, per workload
    best, best_dtype, ratios = top.tokens_per_s, top.dtype, top.ratios

    print()
    for dtype, result in by_dtype.items():
        baseline = result["baseline_dtype"]
        peers = "" if baseline == dtype else f" (vLLM and transformers in {baseline})"
        print(f"[{dtype}{peers}, {args.threads} thread(s), cores {cores}]")
        print(format_table(result.pop("_rows")))
        print()
    print("each system at its best dtype:")
    for workload, by_system in best.items():
        print(f"  {workload}: " + ", ".join(
            f"{s} {v:.1f} tok/s ({best_dtype[workload][s]})" for s, v in by_system.items()))  # fmt: skip
    for key, value in ratios.items():
        print(f"  loragate {key}: {value:.2f}x")
    print("goals: vs_transformers >= 2x; vs_vllm_compiled (mixed and equal) >= 1.3x")
    if not any(k.startswith("vs_vllm") for k in ratios):
        print("no vLLM rows: " + (vllm_offline.missing_reason() if args.vllm != "off"
                                  else "--vllm off"))  # fmt: skip
    load_end = load_average()
    print(f"load average at start {load_start}, at end {load_end}")
    if args.json is not None:
        first = by_dtype[dtypes[0]]
        record = {
            "ratios": ratios,
            "best_dtype": best_dtype,
            "tokens_per_s_best": best,
            # The first dtype's detail at the top level, as before --dtype both existed.
            **{k: first[k] for k in ("mfu", "mfu_detail", "matmul_peak", "workloads", "table")},
            "by_dtype": by_dtype,
            "cores": cores,
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


if __name__ == "__main__":
    sys.exit(main())

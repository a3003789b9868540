"""Structured outputs (JSON Schema) in the loragate engine: their cost, against vLLM, and
whether a big compile stalls running requests. See bench/README.md for the method.

    python bench/structured.py --json bench/out/structured.json
    python bench/structured.py --quick --json bench/out/structured-quick.json

Per workload (greedy, then sampled): rounds in which loragate (a fresh engine: the 64 requests
with their schemas; then another fresh engine: the same prompts with no grammar, each request
held to its constrained answer's token count) and vLLM (offline `LLM`, guidance backend,
compact JSON; structured_vllm.py) each run the whole workload, submitted at once, in rotating
order. Then the compile stall (structured_stall.py). Every answer is parsed and validated.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.structured_cases

import engine_run
import structured_vllm
import torch
import vllm_offline
from plan import WARMUP, ensure_model
from report import load_average, warn_if_busy, write_record
from structured_engine import (
    WARMUP_SCHEMA,
    Chat,
    LoragateRun,
    fresh_engine,
    run_loragate,
    shape_warmup,
)
from structured_stall import measure_compile_stall
from structured_workload import (
    BIG_NUM_PROPERTIES,
    Answer,
    StructuredRequest,
    check_answers,
    make_requests,
    ratios,
)
from workload import BenchRequest, make_workload, token_pool

OUT_DIR = Path(__file__).resolve().parent / "out"  # vLLM logs
MAX_NUM_SEQS = 64
MAX_NUM_BATCHED_TOKENS = 2048
GOALS = "goals: overhead <= 1.10x; vs_vllm >= 1.3x; compile_stall_ms < step_ms_median"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: small (quick: tiny)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny model, 16 requests, 1 round")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="default: every core")
    parser.add_argument("--rounds", type=int, default=None, help="default 5 (quick: 1)")
    parser.add_argument(
        "--vllm",
        choices=["auto", "off", "required"],
        default=None,
        help="default: required (quick: auto)",
    )
    args = parser.parse_args(argv)
    args.model = args.model or Path(f".cache/models/{'tiny' if args.quick else 'small'}")
    args.threads = args.threads or len(os.sched_getaffinity(0))
    # Five: a run of the workload takes a second or two, where one stray process on the shared
    # box can triple a round; the median of five shrugs off two such rounds.
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.vllm = args.vllm or ("auto" if args.quick else "required")
    return args


# ---- rounds -----------------------------------------------------------------------------


@dataclass
class Rounds:
    settings: engine_run.EngineSettings
    loragate: list[tuple[LoragateRun, LoragateRun]] = field(default_factory=list)  # (with, w/o)
    vllm: list[structured_vllm.VllmRun] = field(default_factory=list)


def run_rounds(
    name: str,
    requests: list[StructuredRequest],
    model_dir: Path,
    args: argparse.Namespace,
    vllm: structured_vllm.StructuredVllm | None,
    warmup: list[BenchRequest],
    shapes: list[BenchRequest],
) -> Rounds:
    """Rounds of loragate (constrained, then unconstrained at the same lengths) and vLLM, in
    rotating order, so drift in the machine's speed falls on both alike."""
    sized = [BenchRequest(r.index, r.prompt_token_ids, r.max_tokens) for r in requests]
    rounds = Rounds(
        engine_run.EngineSettings(
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            num_kv_blocks=engine_run.kv_blocks_for(sized, block_size=16),  # never preempts
        )
    )
    systems = ["loragate", "vllm"] if vllm is not None else ["loragate"]
    for r in range(args.rounds):
        shift = r % len(systems)
        for system in systems[shift:] + systems[:shift]:
            if system == "loragate":
                engine = fresh_engine(model_dir, args.dtype, rounds.settings, warmup, shapes)
                constrained = run_loragate(engine, requests, None)
                del engine  # its KV cache goes before the next engine allocates its own
                engine = fresh_engine(model_dir, args.dtype, rounds.settings, warmup, shapes)
                lengths = [len(t) for t in constrained.token_ids]
                plain = run_loragate(engine, requests, lengths)
                del engine
                rounds.loragate.append((constrained, plain))
                print(
                    f"  {name} round {r} loragate: {constrained.elapsed_s:.2f} s constrained, "
                    f"{plain.elapsed_s:.2f} s without grammar, {constrained.num_tokens} tokens",
                    flush=True,
                )
            else:
                assert vllm is not None
                run = vllm.run(structured_vllm.payload(requests))
                rounds.vllm.append(run)
                print(
                    f"  {name} round {r} vLLM: {run.elapsed_s:.2f} s, {run.num_tokens} tokens",
                    flush=True,
                )
    return rounds


def _median_index(values: Sequence[float]) -> int:
    """The round with the median value (the lower middle one of an even count)."""
    return values.index(statistics.median_low(values))


def _figures(elapsed_s: float, num_tokens: int) -> dict[str, float]:
    return {
        "elapsed_s": elapsed_s,
        "num_tokens": num_tokens,
        "tokens_per_s": num_tokens / elapsed_s,
    }


def workload_record(
    rounds: Rounds, requests: list[StructuredRequest], chat: Chat
) -> dict[str, Any]:
    """A workload's JSON: each system's median round, every round, every round's validity."""

    def validity(token_ids: Sequence[Sequence[int]], finishes: Sequence[str | None]) -> Any:
        answers = [Answer(chat.decode(t), f) for t, f in zip(token_ids, finishes, strict=True)]
        return check_answers(requests, answers)

    ours, theirs = rounds.loragate, rounds.vllm
    ours_tps = [c.num_tokens / c.elapsed_s for c, _ in ours]
    theirs_tps = [v.num_tokens / v.elapsed_s for v in theirs]
    mid = ours[_median_index(ours_tps)]
    ours_texts = [chat.decode(t) for t in ours[0][0].token_ids]
    record: dict[str, Any] = {
        "ratios": ratios(
            [c.elapsed_s for c, _ in ours],
            [p.elapsed_s for _, p in ours],
            ours_tps,
            theirs_tps,
            [v.elapsed_s for v in theirs],
        ),
        "num_requests": len(requests),
        "num_prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "temperature": requests[0].temperature,
        "max_tokens": requests[0].max_tokens,
        "loragate": {
            "constrained": mid[0].figures(),
            "unconstrained": mid[1].figures(),
            "rounds": [{"constrained": c.figures(), "unconstrained": p.figures()} for c, p in ours],
            "validity": [validity(c.token_ids, c.finishes) for c, _ in ours],
            "engine_settings": asdict(rounds.settings),
            "answers": ours_texts,  # the first round's
            "num_ending_in_eos": sum(chat.ends_in_eos(t) for t in ours[0][0].token_ids),
        },
    }
    if theirs:
        mid_vllm = theirs[_median_index(theirs_tps)]
        vllm_texts = [chat.decode(o.token_ids) for o in theirs[0].outputs]
        record["vllm"] = {
            "constrained": _figures(mid_vllm.elapsed_s, mid_vllm.num_tokens),
            "rounds": [_figures(v.elapsed_s, v.num_tokens) for v in theirs],
            "validity": [
                validity([o.token_ids for o in v.outputs], [o.finish_reason for o in v.outputs])
                for v in theirs
            ],
            # Answers equal to loragate's as text (first rounds; bf16 sums in another order
            # may pick another token where two logits nearly tie, and sampling draws differ).
            "num_same_answers": sum(a == b for a, b in zip(ours_texts, vllm_texts, strict=True)),
            "answers": vllm_texts,
            "num_ending_in_eos": sum(chat.ends_in_eos(o.token_ids) for o in theirs[0].outputs),
        }
    return record


# ---- the run ----------------------------------------------------------------------------


def print_summary(workloads: dict[str, dict[str, Any]], stall: dict[str, Any]) -> None:
    header = ("workload", "system", "tokens/s", "time s", "tokens", "valid (worst round)")
    rows = [header]
    for name, w in workloads.items():
        cells = [
            ("loragate constrained", w["loragate"]["constrained"], w["loragate"]["validity"]),
            ("loragate no grammar", w["loragate"]["unconstrained"], None),
        ]
        if "vllm" in w:
            cells.append(("vLLM guidance", w["vllm"]["constrained"], w["vllm"]["validity"]))
        for system, fig, valid in cells:
            ok = (
                ""
                if valid is None
                else (f"{min(v['num_valid'] for v in valid)}/{w['num_requests']}")
            )
            rows.append(
                (
                    name,
                    system,
                    f"{fig['tokens_per_s']:.1f}",
                    f"{fig['elapsed_s']:.2f}",
                    str(fig["num_tokens"]),
                    ok,
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for name, w in workloads.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}x" for k, v in w["ratios"].items()))
    print(
        f"compile stall: {stall['compile_stall_ms']:.1f} ms over a median step of "
        f"{stall['step_ms_median']:.1f} ms ({stall['schema_bytes'] / 1e6:.2f} MB schema "
        f"compiled in {stall['compile_s']:.2f} s over {stall['num_steps_during']} steps; as many "
        f"steps with no compile: {stall['noise_stall_ms']:.1f} ms)"
    )
    print(GOALS)


def run_record(
    workloads: dict[str, dict[str, Any]], stall: dict[str, Any], vllm: dict[str, Any] | None
) -> dict[str, Any]:
    """The run's JSON (write_record adds the machine, versions and settings): the headline
    figures at the top, greedy's ratios as `overhead` / `vs_vllm`, sampled's with a suffix."""
    ratios = dict(workloads["greedy"]["ratios"])
    if "sampled" in workloads:
        ratios |= {f"{k}_sampled": v for k, v in workloads["sampled"]["ratios"].items()}
    return {
        "ratios": ratios,
        "compile_stall_ms": stall["compile_stall_ms"],
        "noise_stall_ms": stall.get("noise_stall_ms"),
        "step_ms_median": stall["step_ms_median"],
        "workloads": workloads,
        "compile_stall": stall,
        "vllm": vllm,
        "llguidance": importlib.metadata.version("llguidance"),
        "goals": GOALS,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cores = vllm_offline.share_cores(args.threads)  # vLLM's processes inherit the same cores
    started = datetime.datetime.now().astimezone()
    load_start = load_average()
    model_dir = ensure_model(args.model, "tiny" if args.quick else "small")
    print(
        f"threads {args.threads} on cores {cores}, {args.dtype}, load average {load_start}",
        flush=True,
    )
    warn_if_busy(load_start[0], args.threads)
    if args.vllm == "required" and vllm_offline.vllm_python() is None:
        raise SystemExit(vllm_offline.missing_reason())

    chat = Chat(model_dir)
    num_requests = 16 if args.quick else 64
    workloads = {
        "greedy": make_requests(num_requests, chat.render, sampled=False),
        "sampled": make_requests(num_requests, chat.render, sampled=True),
    }
    pool = token_pool(model_dir)
    warmup = make_workload(WARMUP, pool)
    vllm = None
    results: dict[str, dict[str, Any]] = {}
    try:
        if args.vllm != "off":
            every = [r for requests in workloads.values() for r in requests]
            settings = structured_vllm.settings_for(
                model_dir, args.dtype, every, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS
            )
            vllm = structured_vllm.start(model_dir, settings, OUT_DIR)
        if vllm is not None:  # the engines' warm-up: plain, the prefill shapes, grammar path
            vllm.warm_up(warmup, shape_warmup(workloads["greedy"], pool), WARMUP_SCHEMA)
        for name, requests in workloads.items():
            print(f"workload {name}: {len(requests)} requests", flush=True)
            shapes = shape_warmup(requests, pool)
            rounds = run_rounds(name, requests, model_dir, args, vllm, warmup, shapes)
            results[name] = workload_record(rounds, requests, chat)
    finally:
        if vllm is not None:
            vllm.close()
    print("compile stall", flush=True)
    # --quick: a tenth of the schema. The tiny model's steps are so short that the 16 decoding
    # requests would reach max_tokens before a megabyte compiled at the compiler's priority.
    num_properties = BIG_NUM_PROPERTIES // 10 if args.quick else BIG_NUM_PROPERTIES
    stall = measure_compile_stall(model_dir, args.dtype, chat.render, warmup, num_properties)

    print()
    print_summary(results, stall)
    load_end = load_average()
    print(f"load average at start {load_start}, at end {load_end}")
    record = run_record(results, stall, None if vllm is None else vllm.describe())
    record |= {"rounds": args.rounds, "cores": cores}
    if args.json is not None:
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


if __name__ == "__main__":
    sys.exit(main())

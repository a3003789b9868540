"""Does an engine started beside a busy process run as fast as one started on a quiet machine?

    python bench/start_under_load.py --json bench/out/start_under_load.json
    python bench/start_under_load.py --quick

Issue 47, acceptance 2. The engine times its native paths once per machine and saves them
(engine/step/choices/tuning.py); a start reads the file instead of timing under whatever load it
finds. Each round starts two engines, each in a fresh process, on this run's own tuning file:
one on the machine as it is, one while a process spins on every core (the hog runs through the
engine's construction, the part that chooses, and is killed before the warm-up). Both then run
engine_throughput's mixed workload on a quiet machine, so a difference in tok/s is a difference
in what the start chose. The run's first start (quiet) times and writes the file; the others read
it. Rounds alternate which condition goes first. Prints each start's choices, tok/s per condition
(median, spread) and `ratios.beside_hog_vs_quiet` (1.0: no effect).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

# The hog is the tests' (tests/cpu_hog.py); the checkout ahead of tests/ (its folders would
# otherwise be found as namespace packages before the installed ones).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import engine_run
from cpu_hog import cpu_hog
from fresh_process import in_fresh_process
from plan import FULL, QUICK, WARMUP, ensure_model
from report import load_average, write_record
from workload import make_workload, summarize, token_pool

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.step.choices.cpu_load import others_busy_cores
from engine.step.threads import available_cores

CONDITIONS = ("quiet", "beside-hog")


@dataclass(frozen=True)
class Start:
    condition: str
    choices: dict[str, str]  # choice name -> value
    sources: dict[str, str]  # choice name -> timed | saved | fixed
    busy_cores_at_start: float | None  # other processes' load while the engine was built
    tokens_per_s: float


def one_start(condition: str, model_dir: Path, dtype: str, tuning_file: Path, quick: bool) -> Start:
    """In a fresh process: build the engine (beside the hog or not), then time the workload."""
    plan = QUICK if quick else FULL
    spec = plan.workloads[0]  # mixed lengths
    pool = token_pool(model_dir)
    requests = make_workload(spec, pool)
    settings = engine_run.EngineSettings(
        max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        num_kv_blocks=engine_run.kv_blocks_for(requests, block_size=16),
    )
    config = EngineConfig(
        model=str(model_dir),
        dtype=dtype,
        num_kv_blocks=settings.num_kv_blocks,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        tuning="saved",
        tuning_file=str(tuning_file),
    )  # threads: the engine's default, every core
    with cpu_hog() if condition == "beside-hog" else nullcontext():
        busy = others_busy_cores()
        engine = LLMEngine(config)
    engine_run.warm_up(engine, make_workload(WARMUP, pool))
    run = engine_run.run_engine(engine, requests, settings, condition)
    return Start(
        condition,
        {c.name: str(c.value) for c in engine.startup_choices},
        {c.name: c.source for c in engine.startup_choices},
        busy,
        run.result.tokens_per_s,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default .cache/models/<size>")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny model, two rounds")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rounds", type=int, default=None, help="starts per condition")
    args = parser.parse_args(argv)
    args.threads = available_cores()  # the engine's default, recorded with the run
    plan = QUICK if args.quick else FULL
    rounds = args.rounds or (2 if args.quick else 5)
    model_dir = ensure_model(args.model or Path(f".cache/models/{plan.model_size}"),
                             plan.model_size)  # fmt: skip
    summary = summarize(make_workload(plan.workloads[0], token_pool(model_dir)))
    started = datetime.datetime.now().astimezone()
    load_start = load_average()
    print(f"{rounds} rounds, {available_cores()} cores, dtype {args.dtype}, load {load_start}; "
          f"workload {summary}",
          flush=True)  # fmt: skip
    starts: list[Start] = []
    with tempfile.TemporaryDirectory() as tmp:
        tuning_file = Path(tmp) / "tuning.json"
        for i in range(rounds):
            order = CONDITIONS if i % 2 == 0 else CONDITIONS[::-1]
            for condition in order:
                start = in_fresh_process(
                    one_start, condition, model_dir, args.dtype, tuning_file, args.quick
                )
                starts.append(start)
                busy = (
                    "?" if start.busy_cores_at_start is None else f"{start.busy_cores_at_start:.2f}"
                )
                print(f"  {condition:10s} {start.tokens_per_s:8.1f} tok/s, others busy {busy} "
                      f"cores at start; {start.choices} ({start.sources})", flush=True)  # fmt: skip
    rates = {c: [s.tokens_per_s for s in starts if s.condition == c] for c in CONDITIONS}
    medians = {c: statistics.median(v) for c, v in rates.items()}
    same = all(s.choices == starts[0].choices for s in starts)
    ratio = medians["beside-hog"] / medians["quiet"]
    spread = {c: (max(v) - min(v)) / statistics.median(v) for c, v in rates.items()}
    print(f"\nthe same choices at every start: {same}")
    for c in CONDITIONS:
        print(f"{c:10s} median {medians[c]:.1f} tok/s, spread {100 * spread[c]:.1f}% "
              f"({', '.join(f'{r:.1f}' for r in rates[c])})")  # fmt: skip
    print(f"beside-hog / quiet: {ratio:.3f}x")
    load_end = load_average()
    if args.json is not None:
        record = {
            "ratios": {"beside_hog_vs_quiet": ratio},
            "same_choices": same,
            "medians_tok_s": medians,
            "spread": spread,
            "starts": [s.__dict__ for s in starts],
            "summary": summary,
        }
        write_record(args.json, record, args, model_dir=model_dir, started=started,
                     load_start=load_start, load_end=load_end)  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

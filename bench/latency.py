"""Latency at low load: loragate's HTTP engine vs `vllm serve --tokens-only`, one request at a time.

    python bench/latency.py --model .cache/models/small --json bench/out/latency.json
    python bench/latency.py --quick --model .cache/models/tiny --dtype both

Both servers run at once on the same cores (`--threads`, default every core) and answer the same
`POST /inference/v1/generate` body: a 128-token prompt (token ids, each request its own, so no
prefix-cache hit), 64 output tokens, greedy, `ignore_eos`, streamed. Requests alternate between
the two servers, one in flight at a time, with a pause before each (`--pause-s`, default 1.5 s),
then a wait until the machine is idle (`wait_idle`: under 10% of the CPUs busy over 100 ms, at
most `--max-idle-wait-s`): vLLM's CPU engine keeps both cores busy for about a second after
its last request finishes, and on two shared cores that held the next loragate request's first
token back by the same second (TTFT 1,040 ms with no pause, 824 ms after 0.25 s, 584 ms after
0.5 s, 89 ms after 1 s; 2026-11-24). On an AMX Xeon VM it kept one core busy for 1-1.5 s, so
after the fixed pause alone loragate's ITL measured 10.9 ms where it measured 6.4-6.6 ms with
vLLM idle or a 5 s pause (2026-11-26). Low load means idle between requests; the wait gives
both systems that, however long the other one's tail is here. Time to
first token is the client's, to the first SSE chunk holding a token; inter-token latency is a request's (last token - first token) time over
its remaining tokens (vLLM may put several tokens in one chunk), and the median over requests
is reported. The floor beside them: the bytes of weights a decode step reads (every linear
layer and the lm_head in the run dtype; one embedding row is negligible) over the memory
bandwidth measured here by a large torch copy, at the same thread count.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
import vllm_offline
from plan import ensure_model
from report import load_average, write_record
from workload import BenchRequest, WorkloadSpec, make_workload, token_pool

# The start-and-wait helper is the tests' (tests/server_process.py): one for both.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The checkout ahead of tests/: its folders (tests/tenancy, tests/engine, ...) would otherwise be
# found as namespace packages before the installed ones.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from server_process import free_port, start_logged, wait_healthy

BIN = Path(sys.executable).parent
VLLM_CLI = Path(__file__).with_name("vllm_cli.py")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Timing:
    ttft_ms: float
    itl_ms: float  # mean gap per token after the first chunk
    num_tokens: int
    num_chunks: int


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """SIGTERM to the whole group (vLLM's API server, engine core and worker)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start(name: str, argv: list[str], env: dict[str, str], port: int, workdir: Path) -> Server:
    log = workdir / f"{name}.log"
    proc = start_logged(argv, log, env=env, new_session=True)
    return Server(name, f"http://127.0.0.1:{port}", proc, log)


def wait_up(server: Server) -> None:
    wait_healthy(
        server.url + "/health", server.proc, server.log, timeout_s=START_TIMEOUT_S, interval_s=0.5
    )


def start_loragate(model: Path, dtype: str, threads: int, workdir: Path) -> Server:
    port = free_port()
    argv = [str(BIN / "loragate"), "engine", "--model", str(model), "--served-model-name",
            "bench", "--port", str(port), "--dtype", dtype]  # fmt: skip
    if "--threads" in subprocess.run([*argv[:2], "--help"], capture_output=True, text=True).stdout:
        argv += ["--threads", str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return start(f"loragate-{dtype}", argv, env, port, workdir)


def start_vllm(python: Path, model: Path, dtype: str, workdir: Path) -> Server:
    port = free_port()
    argv = [str(python), str(VLLM_CLI), "serve", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", "bench", "--dtype", dtype,
            "--max-model-len", "2048", "--tokens-only"]  # fmt: skip
    env = vllm_offline.vllm_env(1, vllm_offline.preload_libs(python))
    return start(f"vllm-{dtype}", argv, env, port, workdir)


def print_startup_choices(server: Server) -> None:
    """The engine's logged start-up choices (which kernels this machine got), so a slow
    figure can be told from a slow path."""
    for line in server.log.read_text(errors="replace").splitlines():
        text = line.split(":", 1)[-1].strip()  # after engine/cli.py's "LEVEL:"
        if text.startswith(("engine.", "kernels.", "lora.")):
            print(f"  {server.name} start-up: {text}", flush=True)


def one(client: httpx.Client, url: str, request: BenchRequest) -> Timing:
    body = {
        "token_ids": list(request.prompt_token_ids),
        "sampling_params": {
            "temperature": 0.0,
            "max_tokens": request.num_output_tokens,
            "ignore_eos": True,
        },
        "model": "bench",
        "stream": True,
    }
    start = time.perf_counter()
    first = last = 0.0
    num_first = num_tokens = num_chunks = 0
    with client.stream("POST", url + "/inference/v1/generate", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or []
            n = sum(len(c.get("token_ids") or []) for c in choices)
            if n == 0:
                continue
            now = time.perf_counter()
            if num_tokens == 0:
                first, num_first = now, n
            last = now
            num_tokens += n
            num_chunks += 1
    if num_tokens != request.num_output_tokens:
        raise RuntimeError(f"{url}: {num_tokens} tokens, expected {request.num_output_tokens}")
    itl = (last - first) / max(1, num_tokens - num_first)
    return Timing(1000 * (first - start), 1000 * itl, num_tokens, num_chunks)


def memory_bandwidth(threads: int, size_mib: int = 1024, repeats: int = 7) -> float:
    """Best GB/s of `dst.copy_(src)` over a `size_mib` buffer (bytes read + bytes written)."""
    torch.set_num_threads(threads)
    src = torch.ones(size_mib << 20, dtype=torch.uint8)  # [bytes]
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() / best / 1e9


def decode_weight_bytes(model: Path, dtype: str) -> int:
    """Bytes a decode step must read: every weight but the input embedding (one row of it is
    read), unless the lm_head is tied to it."""
    from safetensors import safe_open

    config = json.loads((model / "config.json").read_text())
    tied = bool(config.get("tie_word_embeddings", False))
    numel = 0
    for path in sorted(model.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if key.endswith("embed_tokens.weight") and not tied:
                    continue
                shape = f.get_slice(key).get_shape()
                count = 1
                for dim in shape:
                    count *= dim
                numel += count
    return numel * DTYPES[dtype].itemsize


def cpu_busy_share(window_s: float) -> float | None:
    """The share of all CPUs' time spent busy (user, nice, system, irq) over `window_s`, from
    /proc/stat; None where there is none (not Linux)."""

    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = fields[0] + fields[1] + fields[2] + sum(fields[5:7])
        return busy, sum(fields[:8])

    try:
        busy0, total0 = read()
        time.sleep(window_s)
        busy1, total1 = read()
    except (OSError, ValueError):
        return None
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_idle(max_s: float, window_s: float = 0.1, idle_share: float = 0.1) -> float:
    """Block until under `idle_share` of the CPUs was busy over a `window_s` window, or
    `max_s` passed; returns the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < max_s:
        share = cpu_busy_share(window_s)
        if share is None or share < idle_share:
            break
    return time.perf_counter() - start


def summarize(timings: Sequence[Timing]) -> dict[str, float]:
    ttft = sorted(t.ttft_ms for t in timings)
    itl = sorted(t.itl_ms for t in timings)
    return {
        "ttft_ms_median": statistics.median(ttft),
        "ttft_ms_p90": ttft[math.ceil(0.9 * len(ttft)) - 1],
        "itl_ms_median": statistics.median(itl),
        "itl_ms_p90": itl[math.ceil(0.9 * len(itl)) - 1],
        "num_requests": len(timings),
        "mean_tokens_per_chunk": statistics.mean(t.num_tokens / t.num_chunks for t in timings),
    }


def measure(
    args: argparse.Namespace, model: Path, dtype: str, requests: list[BenchRequest],
    warmup: list[BenchRequest], workdir: Path,
) -> dict[str, Any]:  # fmt: skip
    python = vllm_offline.vllm_python()
    servers = [start_loragate(model, dtype, args.threads, workdir)]
    if python is None:
        print(vllm_offline.missing_reason(), flush=True)
    timings: dict[str, list[Timing]] = {"loragate": []}
    idle_waits: list[float] = []
    try:
        # One start-up at a time: loragate times its kernels against oneDNN at start-up
        # (engine/step/native_matmul.py), and beside vLLM's load and compile those timings lose
        # (an AVX2 EPYC's run chose PyTorch's bf16 loop: TTFT 1.1 s instead of 0.2).
        wait_up(servers[0])
        print_startup_choices(servers[0])
        if python is not None:
            servers.append(start_vllm(python, model, dtype, workdir))
            timings["vllm"] = []
            wait_up(servers[1])
        with httpx.Client(timeout=600) as client:
            for server in servers:  # compiled kernels, allocator growth, connections
                for r in warmup:
                    one(client, server.url, r)
            for i, request in enumerate(requests):
                for server in servers if i % 2 == 0 else servers[::-1]:
                    time.sleep(args.pause_s)
                    idle_waits.append(wait_idle(args.max_idle_wait_s))
                    timings[server.name.split("-")[0]].append(one(client, server.url, request))
    finally:
        for server in servers:
            server.stop()
    if idle_waits:
        print(f"  waited for an idle machine after the pause: median {statistics.median(idle_waits):.2f} s, "
              f"max {max(idle_waits):.2f} s", flush=True)  # fmt: skip
    result = {name: summarize(t) for name, t in timings.items()}
    for name, s in result.items():
        print(f"  {dtype} {name}: TTFT {s['ttft_ms_median']:.1f} ms, ITL "
              f"{s['itl_ms_median']:.2f} ms (median of {s['num_requests']})", flush=True)  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".cache/models/small"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="fewer requests (tiny model)")
    parser.add_argument("--dtype", choices=[*DTYPES, "both"], default="bfloat16")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--requests", type=int, default=None, help="timed requests per system")
    parser.add_argument(
        "--pause-s", type=float, default=1.5, help="idle time before each request (see above)"
    )
    parser.add_argument(
        "--max-idle-wait-s",
        type=float,
        default=10.0,
        help="after the pause, wait at most this long for the CPUs to go idle (see above)",
    )
    args = parser.parse_args(argv)
    cores = vllm_offline.share_cores(args.threads)
    started = datetime.datetime.now().astimezone()
    load_start = load_average()
    model = ensure_model(args.model, "tiny" if args.quick else "small")
    num_requests = args.requests or (6 if args.quick else 20)
    requests = make_workload(WorkloadSpec("latency", num_requests, (128, 128), (64, 64), 4),
                             token_pool(model))  # fmt: skip
    warmup = make_workload(WorkloadSpec("latency-warmup", 3, (128, 128), (64, 64), 98),
                           token_pool(model))  # fmt: skip
    dtypes = list(DTYPES) if args.dtype == "both" else [args.dtype]
    print(f"threads {args.threads} on cores {cores}, dtypes {dtypes}, {num_requests} requests "
          f"per system, load average {load_start}", flush=True)  # fmt: skip
    bandwidth = memory_bandwidth(args.threads)
    print(f"memory bandwidth (torch copy, {args.threads} thread(s)): {bandwidth:.1f} GB/s")
    workdir = Path(tempfile.mkdtemp(prefix="lg-latency-"))
    by_dtype: dict[str, Any] = {}
    for dtype in dtypes:
        weights = decode_weight_bytes(model, dtype)
        by_dtype[dtype] = {
            **measure(args, model, dtype, requests, warmup, workdir),
            "weight_bytes": weights,
            "bandwidth_bound_ms": 1000 * weights / (bandwidth * 1e9),
        }
    systems = [s for s in ("loragate", "vllm") if s in by_dtype[dtypes[0]]]
    best = {s: min(dtypes, key=lambda d: by_dtype[d][s]["itl_ms_median"]) for s in systems}
    itl = {s: by_dtype[best[s]][s]["itl_ms_median"] for s in systems}
    ttft = {s: by_dtype[best[s]][s]["ttft_ms_median"] for s in systems}
    # The floor of the fastest dtype either system could run: the fewest bytes to read.
    itl["bandwidth_bound"] = min(by_dtype[d]["bandwidth_bound_ms"] for d in dtypes)

    print(f"\n{'dtype':<9} {'system':<9} {'TTFT ms':>8} {'ITL ms':>7} {'ITL p90':>8} "
          f"{'tok/chunk':>9} {'bound ms':>8}")  # fmt: skip
    for dtype, result in by_dtype.items():
        for s in systems:
            r = result[s]
            print(f"{dtype:<9} {s:<9} {r['ttft_ms_median']:>8.1f} {r['itl_ms_median']:>7.2f} "
                  f"{r['itl_ms_p90']:>8.2f} {r['mean_tokens_per_chunk']:>9.2f} "
                  f"{result['bandwidth_bound_ms']:>8.2f}")  # fmt: skip
    print(
        f"\nbest dtype each: {best}; weight bytes / bandwidth bound {itl['bandwidth_bound']:.2f} ms"
    )
    ratios = {"itl_vs_bound": itl["loragate"] / itl["bandwidth_bound"]}
    if "vllm" in itl:
        ratios |= {"itl_vs_vllm": itl["loragate"] / itl["vllm"],
                   "ttft_vs_vllm": ttft["loragate"] / ttft["vllm"]}  # fmt: skip
    else:
        print("no vLLM row: " + vllm_offline.missing_reason())
    for key, value in ratios.items():
        print(f"  loragate {key}: {value:.2f}x")
    print("goals: ITL <= vLLM's (itl_vs_vllm <= 1) and <= 2x the bound (itl_vs_bound <= 2)")
    load_end = load_average()
    print(f"load average at start {load_start}, at end {load_end}")
    if args.json is not None:
        record = {
            "itl_ms": itl,
            "ttft_ms": ttft,
            "ratios": ratios,
            "best_dtype": best,
            "memory_bandwidth_gb_s": bandwidth,
            "by_dtype": by_dtype,
            "cores": cores,
            "num_requests": num_requests,
            "settings": {
                "prompt_tokens": 128,
                "output_tokens": 64,
                "vllm_serve": "--max-model-len 2048 --tokens-only (compiled), "
                "VLLM_CPU_KVCACHE_SPACE=1, OMP threads bound to the cores, tcmalloc + iomp",
                "loragate_engine": "defaults",
                "pause_s": args.pause_s,
                "max_idle_wait_s": args.max_idle_wait_s,
            },
        }
        write_record(args.json, record, args, model_dir=model, started=started,
                     load_start=load_start, load_end=load_end)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

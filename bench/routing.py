"""Engine routing: cache-aware against least-loaded, on identical fleets, in the same run.

For each routing policy (`LORAGATE_ENGINE_ROUTING=cache_aware` and `least_loaded`) a fleet of
three `loragate engine` servers on the tiny model (one thread each) and one gateway in front of
it (one worker, HTTP engine mode): one fleet each, so neither policy's requests evict or find
the other's blocks, and the idle fleet costs nothing while the other runs. Each gateway has
its own 24 tenants, each tenant two conversations that open with the tenant's system prompt. A turn is a streamed completion
of the conversation so far (token ids, greedy, `ignore_eos`); the next turn appends a reply and
a new message (seeded token ids: the same conversations for both policies).

The KV cache is what routing saves, so its size sets the regime. By default each engine has
0.1 GiB (13k tokens of the tiny model in float32, 8 KiB a token): the conversations' working set
(48 prompts, 12k tokens at the first turn, 33k at the fourth, 61k at the eighth) outgrows one
engine's cache at the second turn and the three engines' together (39k) at the fifth: a busy
service's regime, where the tenants' conversations hold more than the fleet can keep, so what
each engine keeps depends on which conversations it is sent. With 0.2 GiB the working set fits
the fleet throughout, a least-loaded fleet finds most of a prompt on whichever engine it picks
(39%), and cache-aware's ceiling on this workload (79%: every turn but the first finds the
previous prompt) bounds the ratio near 2.0; with 1 GiB one engine keeps everything. `--kv-cache-gb`
sets it; bench/RESULTS.md has 0.1, 0.2 and 1 GiB.

Rounds interleave: round k sends turn k of every conversation of one policy, then of the other
(the first policy alternates), in a seeded shuffled order, a fixed number in flight. Reported per
policy: the cached prompt tokens the engines reported (usage), TTFT as the client saw it, and
per replica the requests and tokens each gateway sent and the cached tokens it expected and was
told (its `/metrics`). `ratios` are cache-aware over least-loaded; `max_over_mean_load` is the
busiest replica's requests over the mean. `--json PATH` writes it all; `--quick` is the smoke
run of tests/bench (6 tenants, one conversation each, 3 short turns).

Take timed runs one at a time: `flock /tmp/loragate-bench.lock .venv/bin/python bench/routing.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from gateway_overhead import bootstrap, gateway_env
from gateway_processes import Processes, free_port, start_redis

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
POLICIES = ("cache_aware", "least_loaded")
TOKEN_RANGE = (100, 4000)  # ordinary ids of the tiny model's 4,096 (no special tokens)
UNLIMITED = {
    "requests_per_minute": 10**9, "tokens_per_minute": 10**12, "max_concurrent": 10**6,
    "daily_token_budget": 10**15, "monthly_token_budget": 10**16,
}  # fmt: skip


@dataclass(frozen=True)
class Shape:
    num_tenants: int
    conversations_per_tenant: int
    num_turns: int
    system_tokens: int  # the tenant's system prompt, shared by its conversations
    first_tokens: int  # the conversation's opening message
    reply_tokens: int  # appended per turn for the answer (and generated: max_tokens)
    message_tokens: int  # the next message, appended per turn
    concurrency: int


FULL = Shape(24, 2, 8, 64, 192, 16, 128, 16)
QUICK = Shape(6, 1, 3, 32, 48, 4, 32, 6)


@dataclass
class Conversation:
    key: str  # its tenant's API key
    tokens: list[int]
    turns: list[list[int]] = field(default_factory=list)  # what each later turn appends


def conversations(shape: Shape, seed: int, keys: list[str]) -> list[Conversation]:
    """The same token ids for every policy (`seed`), under that policy's tenants' keys."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]

    out = []
    for tenant in range(shape.num_tenants):
        system = ids(shape.system_tokens)
        for _ in range(shape.conversations_per_tenant):
            turns = [ids(shape.reply_tokens + shape.message_tokens) for _ in range(shape.num_turns)]
            out.append(Conversation(keys[tenant], system + ids(shape.first_tokens), turns))
    return out


def tenant_keys(url: str, admin: str, num: int) -> list[str]:
    """An inference key for each of `num` new tenants whose limits never bind."""
    auth = {"authorization": f"Bearer {admin}"}
    keys = []
    with httpx.Client(base_url=url, headers=auth, timeout=60) as c:
        for i in range(num):
            tenant = c.post("/admin/v1/tenants", json={"name": f"routing-{i}"}).json()
            c.put(f"/admin/v1/tenants/{tenant['id']}/quotas", json=UNLIMITED).raise_for_status()
            key = c.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={"name": "bench"})
            keys.append(str(key.json()["key"]))
    return keys


async def one_turn(
    client: httpx.AsyncClient, conv: Conversation, max_tokens: int
) -> tuple[float, int, int]:
    """(seconds to the first token, prompt tokens, cached prompt tokens) of one streamed turn."""
    body = {"model": "tiny", "prompt": conv.tokens, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"authorization": f"Bearer {conv.key}"}
    start = time.perf_counter()
    ttft, usage = None, None
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if ttft is None and event["choices"]:
                ttft = time.perf_counter() - start
            if event.get("usage"):
                usage = event["usage"]
    assert ttft is not None and usage is not None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return ttft, int(usage["prompt_tokens"]), int(cached)


async def run_round(
    url: str, convs: list[Conversation], turn: int, shape: Shape, seed: int
) -> list[tuple[float, int, int]]:
    """Turn `turn` of every conversation, in a seeded shuffled order, `concurrency` at once."""
    order = list(range(len(convs)))
    random.Random(seed * 1000 + turn).shuffle(order)
    gate = asyncio.Semaphore(shape.concurrency)
    limits = httpx.Limits(max_connections=shape.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def send(i: int) -> tuple[float, int, int]:
            async with gate:
                return await one_turn(client, convs[i], shape.reply_tokens)

        results = await asyncio.gather(*(send(i) for i in order))
    if turn + 1 < shape.num_turns:
        for conv in convs:
            conv.tokens = conv.tokens + conv.turns[turn]
    return list(results)


def replica_counts(url: str) -> dict[str, dict[str, Any]]:
    """Per replica, from a gateway's /metrics: requests (by route), tokens sent, cached tokens
    expected and reported."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {
        "loragate_gateway_engine_prompt_tokens": "prompt_tokens",
        "loragate_gateway_engine_expected_cached_tokens": "expected_cached_tokens",
        "loragate_gateway_engine_cached_tokens": "cached_tokens",
    }
    out: dict[str, dict[str, Any]] = {}
    text = httpx.get(url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            replica = out.setdefault(sample.labels.get("replica", "?"), {"routes": {}})
            if family.name == "loragate_gateway_engine_requests":
                replica["routes"][sample.labels["route"]] = int(sample.value)
            elif family.name in names:
                replica[names[family.name]] = int(sample.value)
    for replica in out.values():
        replica["requests"] = sum(replica["routes"].values())
    return {name: out[name] for name in sorted(out) if name != "?"}


def summarize(results: list[tuple[float, int, int]], replicas: dict[str, Any]) -> dict[str, Any]:
    ttfts = sorted(r[0] for r in results)
    loads = [r["requests"] for r in replicas.values()]
    return {
        "num_requests": len(results),
        "prompt_tokens": sum(r[1] for r in results),
        "cached_tokens": sum(r[2] for r in results),
        "hit_rate": sum(r[2] for r in results) / max(1, sum(r[1] for r in results)),
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p90_ms": 1000 * ttfts[int(0.9 * (len(ttfts) - 1))],
        "max_over_mean_load": max(loads) / statistics.mean(loads) if loads else math.nan,
        "replicas": replicas,
    }


def start_fleet(
    procs: Processes, name: str, model: Path, num_engines: int, kv_cache_gb: float
) -> list[str]:
    ports = [free_port() for _ in range(num_engines)]
    started = []
    for i, port in enumerate(ports):
        started.append(procs.start(f"{name}-engine-{i}", [
            str(BIN / "loragate"), "engine", "--model", str(model), "--served-model-name", "tiny",
            "--port", str(port), "--threads", "1", "--kv-cache-memory-gb", str(kv_cache_gb),
        ]))  # fmt: skip
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    for proc, url in zip(started, urls, strict=True):
        procs.wait_ready(proc, url + "/health", timeout_s=300)
    return urls


def start_gateway(
    procs: Processes,
    policy: str,
    model: Path,
    urls: list[str],
    redis_url: str,
    num: int,
    load_factor: float | None,
) -> tuple[str, list[str]]:
    env = gateway_env(procs, f"gw-{policy}", model, urls, redis_url)
    env["LORAGATE_ENGINE_ROUTING"] = policy
    if load_factor is not None:
        env["LORAGATE_ENGINE_ROUTING_LOAD_FACTOR"] = str(load_factor)
    admin = asyncio.run(bootstrap(env))
    port = free_port()
    proc = procs.start(f"gw-{policy}", [str(BIN / "loragate"), "serve", "--port", str(port),
                                        "--log-level", "warning"], env=env)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    procs.wait_ready(proc, url + "/ready")
    return url, tenant_keys(url, admin, num + 1)  # the last: warm-up


def warm_up(url: str, key: str, shape: Shape) -> None:
    """Short unrelated requests (a tenant of its own), so no timed turn pays a first call."""
    rng = random.Random(-1)
    convs = [Conversation(key, [rng.randrange(*TOKEN_RANGE) for _ in range(40)]) for _ in range(6)]
    asyncio.run(run_round(url, convs, 0, Shape(**{**vars(shape), "num_turns": 1}), seed=-1))


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip() or "unknown"  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the smoke run (about a minute)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--model", type=Path, default=ROOT / ".cache/models/tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument(
        "--load-factor", type=float, help="cache_aware's load bound (default: the setting's)"
    )
    parser.add_argument("--kv-cache-gb", type=float, default=0.1, help="KV cache per engine")
    args = parser.parse_args()
    shape = QUICK if args.quick else FULL
    if not (args.model / "config.json").is_file():
        from engine.make_model import make_model

        make_model(args.model, size="tiny")
    workdir = Path(tempfile.mkdtemp(prefix="lg-bench-routing-"))
    procs = Processes(workdir)
    loads = [os.getloadavg()[0]]
    started = time.monotonic()
    try:
        redis_url = start_redis(procs)
        fleets = {
            policy: start_fleet(procs, policy, args.model, args.engines, args.kv_cache_gb)
            for policy in POLICIES
        }
        gateways = {
            policy: start_gateway(
                procs,
                policy,
                args.model,
                fleets[policy],
                redis_url,
                shape.num_tenants,
                args.load_factor,
            )
            for policy in POLICIES
        }
        convs = {
            policy: conversations(shape, args.seed, keys) for policy, (_, keys) in gateways.items()
        }
        for url, keys in gateways.values():
            warm_up(url, keys[-1], shape)
        before = {policy: replica_counts(url) for policy, (url, _) in gateways.items()}
        print(f"started in {time.monotonic() - started:.1f}s", file=sys.stderr)
        results: dict[str, list[tuple[float, int, int]]] = {p: [] for p in POLICIES}
        for turn in range(shape.num_turns):
            order = POLICIES if turn % 2 == 0 else POLICIES[::-1]
            for policy in order:
                url = gateways[policy][0]
                turn_results = asyncio.run(run_round(url, convs[policy], turn, shape, args.seed))
                results[policy] += turn_results
                loads.append(os.getloadavg()[0])
                cached = sum(r[2] for r in turn_results)
                print(f"turn {turn} {policy}: cached {cached}", file=sys.stderr, flush=True)
        policies = {}
        for policy, (url, _) in gateways.items():
            replicas = replica_counts(url)
            for name, counts in replicas.items():  # the timed turns only, not the warm-up
                for k, v in before[policy].get(name, {}).items():
                    if isinstance(v, int):
                        counts[k] -= v
                    elif k == "routes":
                        for route, n in v.items():
                            counts["routes"][route] -= n
                counts["requests"] = sum(counts["routes"].values())
            policies[policy] = summarize(results[policy], replicas)
    finally:
        procs.stop()
    a, b = policies["cache_aware"], policies["least_loaded"]
    report: dict[str, Any] = {
        "policies": policies,
        "ratios": {
            "cached_tokens": a["cached_tokens"] / max(1, b["cached_tokens"]),
            "ttft_p50": a["ttft_p50_ms"] / b["ttft_p50_ms"],
        },
        "max_over_mean_load": {p: policies[p]["max_over_mean_load"] for p in POLICIES},
        "shape": vars(shape)
        | {
            "num_engines": args.engines,
            "kv_cache_gb": args.kv_cache_gb,
            "load_factor": args.load_factor,
            "seed": args.seed,
        },
        "commit": commit(),
        "cpu": next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "unknown",
        ),
        "num_cpus": os.cpu_count(),
        "load_1m": {"min": min(loads), "max": max(loads)},
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

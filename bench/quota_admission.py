"""Quota admission benchmark: admissions per second and p50 / p99 latency of one admit+settle
cycle's admission, for the Redis store from 1 and from 4 processes, and the in-process store.

The Redis store runs on the gateway's client (`redis_*`: one pipelined connection per process,
tenancy/quota/pipelined.py) and, right after each, on redis-py's pooled client (`redis-py_*`), the
peer it replaced: each Redis row also gives the client process's CPU per admit + settle cycle,
and `ratios.client_cpu_redis_py_over_pipelined` compares the two (saturated, one process).

Each worker runs `--concurrency` coroutines that admit (and settle) against a tenant with limits
high enough never to reject, so the measured path is the full Lua script. Two modes per store:

- saturated (closed loop, no think time): the most admissions per second the store sustains;
  its latency is mostly queueing once clients outnumber cores.
- paced (open loop at `--rate` admissions/s per process): the admission latency at that offered
  load, measured from the moment each admission is sent (a late timer wake-up of the client's
  own event loop is not the store's latency). The p99 goal is read from this mode.

    python bench/quota_admission.py [--quick] [--json PATH] [--redis-url URL]

Without --redis-url (or REDIS_URL) a private redis-server is started on a free loopback port.
Goal: p99 under 2 ms on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tenancy.ids import RequestId
from tenancy.quota.memory_store import InProcessQuotaStore
from tenancy.quota.pipelined import PipelinedRedis
from tenancy.quota.redis_store import RedisQuotaStore
from tenancy.quota.store import QuotaLimits, QuotaStore, QuotaSubject
from tenancy.redis_client import make_redis

BIG = 10**12
LIMITS = QuotaLimits(
    requests_per_minute=BIG, tokens_per_minute=BIG, max_concurrent=BIG,
    daily_token_budget=BIG, monthly_token_budget=BIG,
)  # fmt: skip


async def _drive(
    store: QuotaStore,
    subject: QuotaSubject,
    seconds: float,
    concurrency: int,
    rate: float | None = None,
) -> list[float]:
    """Admission latencies; with `rate` (per process) each coroutine follows a fixed schedule."""
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + seconds
    interval = concurrency / rate if rate else 0.0

    async def loop(offset: float) -> None:
        scheduled = start + offset
        while scheduled < deadline:
            if interval:
                await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            t0 = time.perf_counter()
            adm = await store.admit(
                request_id=RequestId(uuid.uuid4().hex), subjects=[subject], reserve_tokens=128
            )
            latencies.append(time.perf_counter() - t0)
            await store.settle(adm, used_tokens=64)
            scheduled = scheduled + interval if interval else time.perf_counter()

    await asyncio.gather(*(loop(i * interval / concurrency) for i in range(concurrency)))
    return latencies


def _redis_worker(
    args: tuple[str, str, float, int, float, float | None, str],
) -> tuple[list[float], float]:
    """(admission latencies, CPU seconds this process spent in the timed part)."""
    url, prefix, seconds, concurrency, start_at, rate, client = args

    async def run() -> tuple[list[float], float]:
        store = RedisQuotaStore(
            PipelinedRedis(url)
            if client == "pipelined"
            else make_redis(url, max_connections=concurrency),
            prefix=prefix,
            lease_ttl_s=60,
        )
        subject = QuotaSubject("t:bench", LIMITS)
        await store.admit(
            request_id=RequestId(uuid.uuid4().hex), subjects=[subject], reserve_tokens=1
        )
        await asyncio.sleep(max(0.0, start_at - time.time()))
        cpu = time.process_time()
        try:
            latencies = await _drive(store, subject, seconds, concurrency, rate)
            return latencies, time.process_time() - cpu
        finally:
            await store.close()

    return asyncio.run(run())


def _summarise(latencies: list[float], seconds: float) -> dict[str, float]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "admissions_per_s": len(ordered) / seconds,
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": p99 * 1000,
        "n": len(ordered),
    }


def bench_redis(
    url: str,
    procs: int,
    seconds: float,
    concurrency: int,
    rate: float | None = None,
    client: str = "pipelined",
) -> dict[str, float]:
    """`client`: "pipelined", the gateway's (tenancy/quota/pipelined.py), or "redis-py"."""
    prefix = f"lgbench:{uuid.uuid4().hex[:8]}:"
    start_at = time.time() + 1.0 + 0.3 * procs
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:
        work = [(url, prefix, seconds, concurrency, start_at, rate, client)] * procs
        results = pool.map(_redis_worker, work)
    _cleanup(url, prefix)
    summary = _summarise([x for r, _ in results for x in r], seconds)
    # Client CPU per admit + settle cycle: what the gateway's process pays for its quota store.
    summary["cpu_us_per_cycle"] = sum(c for _, c in results) / max(1, summary["n"]) * 1e6
    return summary


def _cleanup(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


def bench_inprocess(
    seconds: float, concurrency: int, rate: float | None = None
) -> dict[str, float]:
    store = InProcessQuotaStore(lease_ttl_s=60)
    subject = QuotaSubject("t:bench", LIMITS)
    return _summarise(asyncio.run(_drive(store, subject, seconds, concurrency, rate)), seconds)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs; finishes in < 1 min")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--concurrency", type=int, default=1, help="coroutines per process")
    parser.add_argument(
        "--rate", type=float, default=250.0, help="paced mode: admissions/s offered per process"
    )
    args = parser.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 15.0)

    server: subprocess.Popen[bytes] | None = None
    workdir = None
    url = args.redis_url
    if not url:
        port = _free_port()
        workdir = tempfile.mkdtemp(prefix="lg-bench-redis-")
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"redis://127.0.0.1:{port}/0"
        time.sleep(0.5)
    # redis_*: the gateway's client (one pipelined connection); redis-py_*: redis-py's pooled
    # client, run right after each, for the comparison.
    cells = [(n, f"{name}_{n}proc", client) for n in (1, 4)
             for name, client in (("redis", "pipelined"), ("redis-py", "redis-py"))]  # fmt: skip
    try:
        saturated = {
            name: bench_redis(url, n, seconds, args.concurrency, client=client)
            for n, name, client in cells
        }
        saturated["inprocess"] = bench_inprocess(seconds, args.concurrency)
        paced = {
            name: bench_redis(url, n, seconds, args.concurrency, args.rate, client=client)
            for n, name, client in cells
        }
        paced["inprocess"] = bench_inprocess(seconds, args.concurrency, args.rate)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"{'mode':<11}{'store':<17}{'admissions/s':>14}{'p50 ms':>10}{'p99 ms':>10}{'n':>10}"
        f"{'client CPU us/cycle':>21}"
    )
    for mode, results in (("saturated", saturated), (f"{args.rate:.0f}/s/proc", paced)):
        for name, r in results.items():
            cpu = f"{r['cpu_us_per_cycle']:>21.1f}" if "cpu_us_per_cycle" in r else ""
            print(
                f"{mode:<11}{name:<17}{r['admissions_per_s']:>14.0f}{r['p50_ms']:>10.3f}"
                f"{r['p99_ms']:>10.3f}{r['n']:>10.0f}{cpu}"
            )
    # redis-py / the gateway's client, saturated from one process: CPU per admit + settle.
    cpu_ratio = (
        saturated["redis-py_1proc"]["cpu_us_per_cycle"]
        / saturated["redis_1proc"]["cpu_us_per_cycle"]
    )
    print(f"client CPU per cycle, redis-py / pipelined (saturated, 1 process): x{cpu_ratio:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            # Latency at the paced load (the goal's reading); throughput at saturation.
            "p99_ms": {k: round(v["p99_ms"], 4) for k, v in paced.items()},
            "p50_ms": {k: round(v["p50_ms"], 4) for k, v in paced.items()},
            "admissions_per_s": {k: round(v["admissions_per_s"], 1) for k, v in saturated.items()},
            "ratios": {"client_cpu_redis_py_over_pipelined": round(cpu_ratio, 3)},
            "saturated": saturated,
            "paced": paced,
            "rate_per_process": args.rate,
            "seconds": seconds,
            "concurrency_per_process": args.concurrency,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

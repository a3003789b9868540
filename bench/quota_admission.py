"""Quota admission benchmark: admissions per second and p50 / p99 latency of one admit+settle
cycle's admission, for the Redis store from 1 and from 4 processes, and the in-process store.

Each worker runs `--concurrency` coroutines that admit (and settle) in a loop against a tenant
with limits high enough never to reject, so the measured path is the full Lua script.

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
from tenancy.quota_memory import InProcessQuotaStore
from tenancy.quota_redis import RedisQuotaStore
from tenancy.quotas import QuotaLimits, QuotaStore, QuotaSubject
from tenancy.redis_client import make_redis

BIG = 10**12
LIMITS = QuotaLimits(
    requests_per_minute=BIG, tokens_per_minute=BIG, max_concurrent=BIG,
    daily_token_budget=BIG, monthly_token_budget=BIG,
)  # fmt: skip


async def _drive(
    store: QuotaStore, subject: QuotaSubject, seconds: float, concurrency: int
) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            adm = await store.admit(
                request_id=RequestId(uuid.uuid4().hex), subjects=[subject], reserve_tokens=128
            )
            latencies.append(time.perf_counter() - t0)
            await store.settle(adm, used_tokens=64)

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return latencies


def _redis_worker(args: tuple[str, str, float, int, float]) -> list[float]:
    url, prefix, seconds, concurrency, start_at = args

    async def run() -> list[float]:
        store = RedisQuotaStore(
            make_redis(url, max_connections=concurrency), prefix=prefix, lease_ttl_s=60
        )
        subject = QuotaSubject("t:bench", LIMITS)
        await store.admit(
            request_id=RequestId(uuid.uuid4().hex), subjects=[subject], reserve_tokens=1
        )
        await asyncio.sleep(max(0.0, start_at - time.time()))
        try:
            return await _drive(store, subject, seconds, concurrency)
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


def bench_redis(url: str, procs: int, seconds: float, concurrency: int) -> dict[str, float]:
    prefix = f"lgbench:{uuid.uuid4().hex[:8]}:"
    start_at = time.time() + 1.0 + 0.3 * procs
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:
        results = pool.map(_redis_worker, [(url, prefix, seconds, concurrency, start_at)] * procs)
    _cleanup(url, prefix)
    return _summarise([x for r in results for x in r], seconds)


def _cleanup(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


def bench_inprocess(seconds: float, concurrency: int) -> dict[str, float]:
    store = InProcessQuotaStore(lease_ttl_s=60)
    subject = QuotaSubject("t:bench", LIMITS)
    return _summarise(asyncio.run(_drive(store, subject, seconds, concurrency)), seconds)


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
    try:
        results = {
            "redis_1proc": bench_redis(url, 1, seconds, args.concurrency),
            "redis_4proc": bench_redis(url, 4, seconds, args.concurrency),
            "inprocess": bench_inprocess(seconds, args.concurrency),
        }
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"{'store':<14}{'admissions/s':>14}{'p50 ms':>10}{'p99 ms':>10}{'n':>10}")
    for name, r in results.items():
        print(
            f"{name:<14}{r['admissions_per_s']:>14.0f}{r['p50_ms']:>10.3f}"
            f"{r['p99_ms']:>10.3f}{r['n']:>10.0f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "p99_ms": {k: round(v["p99_ms"], 4) for k, v in results.items()},
            "p50_ms": {k: round(v["p50_ms"], 4) for k, v in results.items()},
            "admissions_per_s": {k: round(v["admissions_per_s"], 1) for k, v in results.items()},
            "seconds": seconds,
            "concurrency_per_process": args.concurrency,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Gateway overhead: what auth + Redis quotas + metrics + the engine client add to a request.

Measured with `wrk`, in one run, on the same request body (`POST /inference/v1/generate`, 8 new
tokens, not streamed):

- "stand-in": an engine stand-in that answers the tokens-only protocol instantly (a BENCHMARK
  FIXTURE ONLY, bench/gateway_standin.py), called directly, then through one gateway worker
  (`loragate serve`, HTTP engine mode, Redis quota store, SQLite key store, metrics on);
- "tiny engine": the real engine server on the tiny model, directly, then through a gateway.

Latency (p50 / p99) comes from runs with one connection (requests back to back), so it is the
cost of one request rather than queueing; throughput (requests/s) from runs with many
connections. "Added" is the gateway run minus the direct run. `--json PATH` writes
`{"added_ms": {"p50", "p99"}, "rps_per_worker", ...}`; `--quick` finishes in under a minute.

This file starts the processes and gateways; the wrk runs are in bench/gateway_wrk.py, the report
in bench/gateway_report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from gateway_litellm import missing_reason as litellm_missing
from gateway_litellm import start_litellm
from gateway_processes import Processes, free_port, postgres_database, start_redis
from gateway_report import print_table, summarize
from gateway_stream import stream_report
from gateway_wrk import Target, measure

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


async def bootstrap(env: dict[str, str]) -> str:
    """Migrate the gateway's database and create its first admin key (what `loragate admin
    bootstrap` does), in this process: a CLI process per gateway costs seconds of start-up."""
    from tenancy.auth.bootstrap import bootstrap_admin
    from tenancy.auth.key_format import KeyMinter
    from tenancy.sql.migrate import upgrade
    from tenancy.sql.session import make_engine, make_sessionmaker

    engine = make_engine(env["LORAGATE_DATABASE_URL"])
    try:
        await upgrade(engine)
        async with make_sessionmaker(engine)() as session:
            created = await bootstrap_admin(
                session,
                minter=KeyMinter(prefix="lg", pepper=env["LORAGATE_KEY_PEPPER"].encode()),
                tiers=frozenset({"realtime", "standard", "batch"}),
                default_tier="standard",
            )
    finally:
        await engine.dispose()
    return created.key


def gateway_env(
    procs: Processes,
    name: str,
    model: Path,
    engine_urls: list[str],
    redis_url: str,
    engine_kind: str | None = None,
    keys: str = "sqlite",
    stack: str | None = None,
) -> dict[str, str]:
    """A gateway process's environment: HTTP engine mode over `engine_urls`, Redis quotas under
    a key prefix of its own, a fresh database (SQLite, or PostgreSQL with `keys="postgres"`)
    migrated at start; `stack` ("PARSER/LOOP", e.g. "httptools/uvloop") sets its HTTP stack."""
    database = (
        postgres_database(procs)
        if keys == "postgres"
        else f"sqlite+aiosqlite:///{procs.workdir / name}.db"
    )
    env = {
        **os.environ,
        "LORAGATE_MODEL": str(model),
        "LORAGATE_SERVED_MODEL_NAME": "tiny",
        "LORAGATE_DATABASE_URL": database,
        "LORAGATE_KEY_PEPPER": secrets.token_urlsafe(32),
        "LORAGATE_SALT_SECRET": secrets.token_urlsafe(32),
        "LORAGATE_AUTO_MIGRATE": "true",
        "LORAGATE_ENGINE_MODE": "http",
        "LORAGATE_ENGINE_URLS": json.dumps(engine_urls),
        "LORAGATE_QUOTA_STORE": "redis",
        "LORAGATE_REDIS_URL": redis_url,
        "LORAGATE_REDIS_KEY_PREFIX": f"lgbench:{uuid.uuid4().hex[:8]}:",
    }
    if engine_kind is not None:
        env["LORAGATE_ENGINE_KIND"] = engine_kind
    if stack is not None:
        env["LORAGATE_HTTP_PARSER"], env["LORAGATE_EVENT_LOOP"] = stack.split("/")
    return env


def bench_key(url: str, admin: str) -> str:
    """An inference key of a new tenant whose limits are checked on every request and never
    bind in a benchmark run."""
    auth = {"authorization": f"Bearer {admin}"}
    tenant = httpx.post(url + "/admin/v1/tenants", json={"name": "bench"}, headers=auth).json()
    limits = {
        "requests_per_minute": 10**9,
        "tokens_per_minute": 10**12,
        "max_concurrent": 10**6,
        "daily_token_budget": 10**15,
        "monthly_token_budget": 10**16,
    }
    httpx.put(url + f"/admin/v1/tenants/{tenant['id']}/quotas", json=limits, headers=auth)
    return str(
        httpx.post(
            url + f"/admin/v1/tenants/{tenant['id']}/keys", json={"name": "bench"}, headers=auth
        ).json()["key"]
    )


def start_gateway(
    procs: Processes,
    name: str,
    model: Path,
    engine_url: str,
    redis_url: str,
    migrations: threading.Lock,
    source: Path | None = None,
    keys: str = "sqlite",
    stack: str | None = None,
) -> tuple[str, str]:
    """A one-worker gateway in HTTP engine mode; returns (url, an inference key). `source`: run
        the gateway code of that checkout instead of this one (PYTHONPATH comes before the editable
        install), e.g. the commit before a change, for a same-run comparison. `migrations`: alembic
    keeps its context in module globals, so two upgrades in one process must not overlap."""
    env = gateway_env(procs, name, model, [engine_url], redis_url, keys=keys, stack=stack)
    if source is not None:
        # Its own code first, also where this bench runs under a PYTHONPATH of its own (a
        # checkout of this code beside a working tree that others are changing).
        env["PYTHONPATH"] = os.pathsep.join([str(source), *filter(None, [env.get("PYTHONPATH")])])
    if source is None:
        with migrations:
            admin = asyncio.run(bootstrap(env))
    else:  # that checkout's own migrations: this one's revisions are unknown to an older one
        admin = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "admin", "bootstrap"],
            cwd=source, env=env, capture_output=True, text=True,
            check=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
    port = free_port()
    command = [str(BIN / "loragate")]
    if source is not None:
        # `python -m` puts the working directory first on sys.path: run from the checkout.
        command = [sys.executable, "-m", "gateway.cli"]
        where = subprocess.run(
            [sys.executable, "-c", "import gateway; print(gateway.__file__)"],
            cwd=source, env=env, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        if not where.startswith(str(source)):
            raise RuntimeError(f"the baseline would import {where}, not {source}")
    proc = procs.start(
        name,
        [*command, "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        cwd=source,
    )
    url = f"http://127.0.0.1:{port}"
    procs.wait_ready(proc, url + "/ready")
    return url, bench_key(url, admin)


# ---- main ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (under a minute)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--model", type=Path, default=ROOT / ".cache/models/tiny")
    parser.add_argument("--duration", type=int, default=None, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--no-real-engine", action="store_true")
    parser.add_argument(
        "--keys",
        choices=["sqlite", "postgres"],
        default="sqlite",
        help="the gateways' database (keys, policies, usage): a SQLite file, or a fresh database "
        "on DATABASE_URL's PostgreSQL (else 127.0.0.1:5432)",
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="also measure a gateway running the code of this checkout (e.g. `git worktree add "
        "DIR <commit>`), on the stand-in, interleaved with this code's",
    )
    parser.add_argument(
        "--stacks",
        type=lambda text: [s for s in text.split(",") if s],
        default=[],
        help="more gateways on the stand-in, one per HTTP stack PARSER/LOOP (e.g. "
        "httptools/uvloop,h11/uvloop), in the same rounds as the default one",
    )
    parser.add_argument(
        "--litellm",
        choices=["auto", "off", "required"],
        default="auto",
        help="LiteLLM's proxy (plain and with Redis) on the same stand-in, chat completions, in "
        "the same rounds: auto when its venv exists (`make litellm-venv`)",
    )
    parser.add_argument("--standin", type=int, help=argparse.SUPPRESS)  # the fixture process
    args = parser.parse_args()
    if args.standin:
        from gateway_standin import run_standin  # bench/ is the script's directory

        run_standin(args.standin)
        return 0
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get update && apt-get install -y wrk", file=sys.stderr)
        return 2
    use_litellm = args.litellm != "off" and litellm_missing() is None
    if args.litellm == "required" and not use_litellm:
        raise SystemExit(litellm_missing())
    if args.litellm == "auto" and not use_litellm:
        print(f"no LiteLLM rows: {litellm_missing()}", file=sys.stderr)
    args.duration = args.duration or (3 if args.quick else 10)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if not (args.model / "config.json").is_file():
        from engine.make_model import make_model

        make_model(args.model, size="tiny")
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="lg-bench-gw-"))
    procs = Processes(workdir)
    results: dict[str, dict[str, Any]] = {}
    try:
        redis_url = start_redis(procs)
        standin_port, engine_port = free_port(), free_port()
        standin_proc = procs.start(
            "standin", [sys.executable, __file__, "--standin", str(standin_port)]
        )
        standin = f"http://127.0.0.1:{standin_port}"
        engine = f"http://127.0.0.1:{engine_port}"
        # --quick measures the gateway's own cost only (the stand-in); the full run adds the
        # real engine.
        real = not (args.no_real_engine or args.quick)
        if real:
            engine_proc = procs.start(
                "engine",
                [
                    str(BIN / "loragate"),
                    "engine",
                    "--model",
                    str(args.model),
                    "--port",
                    str(engine_port),
                    "--served-model-name",
                    "tiny",
                ],
            )
        procs.wait_ready(standin_proc, standin + "/health")
        # Everything starts at once (start-up is most of a quick run); nothing is measured
        # until all of it is up and idle.
        migrations = threading.Lock()
        with ThreadPoolExecutor(max_workers=2) as pool:
            first = pool.submit(
                start_gateway,
                procs,
                "gw-standin",
                args.model,
                standin,
                redis_url,
                migrations,
                keys=args.keys,
            )
            stacks = {
                stack: pool.submit(
                    start_gateway, procs, f"gw-{stack.replace('/', '-')}", args.model, standin,
                    redis_url, migrations, keys=args.keys, stack=stack,
                )
                for stack in args.stacks
            }  # fmt: skip
            if args.baseline_src:
                base = pool.submit(
                    start_gateway, procs, "gw-baseline", args.model, standin, redis_url,
                    migrations, args.baseline_src.resolve(), keys=args.keys,
                )  # fmt: skip
            if real:
                procs.wait_ready(engine_proc, engine + "/health")
                second = pool.submit(
                    start_gateway,
                    procs,
                    "gw-engine",
                    args.model,
                    engine,
                    redis_url,
                    migrations,
                    keys=args.keys,
                )
            gateway, key = first.result()
            standin_targets: dict[str, Target] = {
                "stand-in direct": Target(standin, None, False),
                "stand-in via gateway": Target(gateway, key, False),
            }
            for stack, started_gateway in stacks.items():
                standin_targets[f"stand-in via gateway [{stack}]"] = Target(
                    *started_gateway.result(), False
                )
            if args.baseline_src:
                standin_targets["stand-in via baseline gateway"] = Target(*base.result(), False)
            if real:
                gateway2, key2 = second.result()
        if use_litellm:
            # The same work as OpenAI chat completions, through our gateway and LiteLLM's.
            plain = start_litellm(procs, "litellm", standin)
            with_redis = start_litellm(procs, "litellm-redis", standin, redis_url)
            standin_targets |= {
                "chat: stand-in direct": Target(standin, None, False, "chat"),
                "chat: via gateway": Target(gateway, key, False, "chat"),
                "chat: via LiteLLM": Target(plain.url, plain.key, False, "chat"),
                "chat: via LiteLLM + Redis": Target(with_redis.url, with_redis.key, False, "chat"),
            }
        print(f"started in {time.monotonic() - started:.1f}s", file=sys.stderr)
        results.update(measure(standin_targets, args, workdir))
        # 64-token streams, stand-in direct and through the default gateway (acceptance 3), and
        # through the baseline's in the same rounds.
        stream_targets = {"direct": (standin, None), "via": (gateway, key)}
        if args.baseline_src:
            stream_targets["baseline"] = standin_targets["stand-in via baseline gateway"][:2]
        stream = stream_report(
            stream_targets,
            rounds=args.rounds,
            requests=50 if args.quick else 200,
        )
        if real:
            targets: dict[str, Target] = {
                "tiny engine direct, streamed": Target(engine, None, True),
                "tiny engine via gateway": Target(gateway2, key2, False),
            }
            if not args.quick:
                targets["tiny engine direct"] = Target(engine, None, False)
            results.update(measure(targets, args, workdir))
    finally:
        procs.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    report = summarize(results, args)
    report["stream"] = stream
    print_table(results, report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a request's CPU goes on the gateway's full configuration (issue 48, acceptance 6).

One gateway worker (`loragate serve`, HTTP engine mode) with everything on: keys, policies and the
usage ledger in a fresh PostgreSQL database, Redis quotas, metrics, on the engine stand-in of
bench/gateway_overhead.py. wrk drives it at `--connections` (16) in two windows of `--duration`
seconds each:

1. CPU accounting, nothing else running: the CPU time each process used (/proc/PID/stat: the
   gateway, the stand-in, our Redis, every PostgreSQL process on the machine, wrk's own from
   wait4), divided by the requests served: the gateway's share of a request's CPU.
2. A py-spy profile of the gateway worker (`--py-spy`, sampling perturbs the run, so it is not
   the window that is accounted): self time by frame and by area (our packages by subpackage,
   libraries by name, asyncio, the event loop).

`--json FILE` writes {"rps", "cpu_us_per_request": {process: us}, "gateway_share", "profile":
{"samples", "top_frames", "areas"}}. The aggregation is in bench/gateway_profile_report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gateway_overhead import start_gateway
from gateway_processes import Processes, free_port, start_redis
from gateway_profile_report import aggregate_raw, print_report
from gateway_wrk import PATHS, write_script

ROOT = Path(__file__).resolve().parent.parent
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) so far; 0 for one that is gone."""
    try:
        # The command name (field 2) may hold spaces: the fields after its ")" are fixed.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15)


def pids_named(name: str) -> list[int]:
    """Every process whose command name is `name` (PostgreSQL's backends fork per connection)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def run_wrk(
    url: str, script: Path, api: str, connections: int, duration_s: int
) -> tuple[int, float]:
    """(requests served, wrk's own CPU seconds): wait4 reads a child's CPU as it is reaped."""
    proc = subprocess.Popen(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "-s", str(script), url + PATHS[api]],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed:\n{out}")
    if re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        raise RuntimeError(f"the gateway answered errors under load:\n{out}")
    requests = int(re.search(r"(\d+) requests in", out)[1])  # type: ignore[index]
    return requests, usage.ru_utime + usage.ru_stime


def account(
    processes: dict[str, list[int]], url: str, script: Path, args: argparse.Namespace
) -> dict[str, object]:
    """Window 1: requests/s and each process's CPU microseconds per request."""

    def snapshot() -> dict[str, dict[int, float]]:
        found = {name: {pid: cpu_seconds(pid) for pid in pids} for name, pids in processes.items()}
        found["postgres"] = {pid: cpu_seconds(pid) for pid in pids_named("postgres")}
        return found

    before = snapshot()
    started = time.monotonic()
    requests, wrk_cpu = run_wrk(url, script, args.api, args.connections, args.duration)
    elapsed = time.monotonic() - started
    after = snapshot()
    used = {
        name: sum(cpu - before[name].get(pid, 0.0) for pid, cpu in after[name].items())
        for name in after
    }
    used["wrk"] = wrk_cpu
    per_request = {name: round(cpu / requests * 1e6, 1) for name, cpu in used.items()}
    total = sum(per_request.values())
    return {
        "requests": requests,
        "rps": round(requests / elapsed, 1),
        "cpu_us_per_request": per_request,
        "gateway_share": round(per_request["gateway"] / total, 3),
    }


def profile(
    gateway_pid: int, url: str, script: Path, args: argparse.Namespace
) -> dict[str, object]:
    """Window 2: py-spy on the gateway worker while wrk drives it."""
    raw = Path(script.parent) / "gateway.pyspy"
    spy = subprocess.Popen(
        [PY_SPY, "record", "--pid", str(gateway_pid), "--rate", "250", "--duration",
         str(args.duration), "--format", "raw", "--nonblocking", "--output", str(raw)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.5)  # py-spy attached before the load starts
    run_wrk(url, script, args.api, args.connections, args.duration)
    _, err = spy.communicate(timeout=args.duration + 60)
    if spy.returncode != 0 or not raw.exists():
        raise RuntimeError(f"py-spy failed (ptrace allowed here?):\n{err}")
    return aggregate_raw(raw.read_text(), root=ROOT, top=args.top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=15, help="seconds per window")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--api", choices=sorted(PATHS), default="tokens")
    parser.add_argument("--py-spy", choices=["auto", "off", "required"], default="auto")
    parser.add_argument("--top", type=int, default=15, help="frames in the top list")
    parser.add_argument("--model", type=Path, default=ROOT / ".cache/models/tiny")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get update && apt-get install -y wrk")
    spy = args.py_spy != "off" and Path(PY_SPY).exists()
    if args.py_spy == "required" and not spy:
        raise SystemExit("py-spy is not installed: .venv/bin/python -m pip install py-spy")
    if args.py_spy == "auto" and not spy:
        print("no profile: py-spy is not installed (pip install py-spy)", file=sys.stderr)
    if not (args.model / "config.json").is_file():
        from engine.make_model import make_model

        make_model(args.model, size="tiny")
    workdir = Path(tempfile.mkdtemp(prefix="lg-bench-prof-"))
    procs = Processes(workdir)
    try:
        own_redis = not os.environ.get("REDIS_URL")
        redis_url = start_redis(procs)
        port = free_port()
        standin = procs.start(
            "standin",
            [sys.executable, str(ROOT / "bench/gateway_overhead.py"), "--standin", str(port)],
        )
        procs.wait_ready(standin, f"http://127.0.0.1:{port}/health")
        url, key = start_gateway(
            procs, "gw", args.model, f"http://127.0.0.1:{port}", redis_url, threading.Lock(),
            keys="postgres",
        )  # fmt: skip
        gateway_pid = procs.procs[-1].pid
        processes = {"gateway": [gateway_pid], "stand-in": [standin.pid]}
        if own_redis:
            processes["redis"] = [procs.procs[0].pid]
        script = write_script(workdir, key, api=args.api)
        run_wrk(url, script, args.api, args.connections, 3)  # warm-up
        report: dict[str, object] = {
            "config": {"api": args.api, "connections": args.connections,
                       "duration_s": args.duration, "keys": "postgres", "quotas": "redis"},
            **account(processes, url, script, args),
        }  # fmt: skip
        if not own_redis:
            report["note"] = "REDIS_URL set: the shared Redis server's CPU is not counted"
        if spy:
            report["profile"] = profile(gateway_pid, url, script, args)
    finally:
        procs.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print_report(report)
    if args.json:
        from report import machine_info, versions  # torch and transformers: only to record

        record = {**report, "machine": machine_info(), "versions": versions()}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The `wrk` runs of `bench/gateway_overhead.py`: one run against a target (the request body,
the Lua script that carries the key, wrk's output read into p50 / p99 / requests per second /
non-2xx responses), and interleaved rounds over several targets."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

BODY = {"token_ids": list(range(100, 132)), "sampling_params": {"max_tokens": 8, "temperature": 0}}
# The same work through OpenAI's chat API (what LiteLLM's proxy serves): a short user message,
# 8 new tokens, the model every stand-in route and gateway names "tiny".
CHAT_BODY = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Say something short about the sea and the sky."}],
    "max_tokens": 8,
    "temperature": 0,
}
PATHS = {"tokens": "/inference/v1/generate", "chat": "/v1/chat/completions"}
BODIES: dict[str, dict[str, Any]] = {"tokens": BODY, "chat": CHAT_BODY}


@dataclass
class WrkResult:
    p50_ms: float
    p99_ms: float
    rps: float
    errors: int


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if match is None:
        raise ValueError(f"unreadable wrk latency {text!r}")
    return float(match[1]) * _UNITS[match[2]]


def write_script(
    workdir: Path, key: str | None, *, stream: bool = False, api: str = "tokens"
) -> Path:
    """wrk's Lua script for one target: the method, the key (readable by this user only) and
    the body of `api`."""
    script = workdir / f"wrk-{uuid.uuid4().hex[:6]}.lua"
    headers = f'wrk.headers["Authorization"] = "Bearer {key}"\n' if key else ""
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"{headers}wrk.body = [[{json.dumps({**BODIES[api], 'stream': stream})}]]\n"
    )
    script.chmod(0o600)
    return script


def run_wrk(
    url: str,
    key: str | None,
    *,
    connections: int,
    duration_s: int,
    workdir: Path,
    stream: bool = False,
    api: str = "tokens",
) -> WrkResult:
    script = write_script(workdir, key, stream=stream, api=api)
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{duration_s}s",
            "--latency",
            "-s",
            str(script),
            url + PATHS[api],
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    script.unlink()
    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.M))
    if "50" not in latency or "99" not in latency:
        raise RuntimeError(f"wrk gave no latency distribution:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return WrkResult(_ms(latency["50"]), _ms(latency["99"]), rps, int(errors[1]) if errors else 0)


class Target(NamedTuple):
    url: str
    key: str | None
    stream: bool
    api: str = "tokens"  # tokens | chat (PATHS)


def measure(
    targets: dict[str, Target], args: argparse.Namespace, workdir: Path
) -> dict[str, dict[str, Any]]:
    """Interleaved rounds (each target once per round, latency then load); medians over rounds,
    so a burst of load from other processes hits every target alike."""
    rounds: dict[str, list[tuple[WrkResult, WrkResult]]] = {name: [] for name in targets}
    for url, key, stream, api in targets.values():
        run_wrk(url, key, connections=4, duration_s=1, workdir=workdir, stream=stream, api=api)
    for _ in range(args.rounds):
        for name, (url, key, stream, api) in targets.items():
            run = partial(run_wrk, url, key, workdir=workdir, stream=stream, api=api)
            latency = run(connections=1, duration_s=args.duration)
            load = run(connections=args.connections, duration_s=args.duration)
            rounds[name].append((latency, load))
    return {
        name: {
            "p50_ms": statistics.median(lat.p50_ms for lat, _ in runs),
            "p99_ms": statistics.median(lat.p99_ms for lat, _ in runs),
            "rps": statistics.median(load.rps for _, load in runs),
            "errors": sum(lat.errors + load.errors for lat, load in runs),
        }
        for name, runs in rounds.items()
    }

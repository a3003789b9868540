"""Processes of `bench/gateway_overhead.py`: free ports, readiness waits, Redis, cleanup."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


class Processes:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, name: str, args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        with open(self.workdir / f"{name}.log", "wb") as log:
            self.procs.append(
                subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
            )

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_redis(procs: Processes) -> str:
    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"]
    port = free_port()
    procs.start(
        "redis",
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(procs.workdir),
        ],
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return f"redis://127.0.0.1:{port}/0"
        time.sleep(0.05)
    raise RuntimeError("redis did not start")

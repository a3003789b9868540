"""Processes of `bench/gateway_overhead.py`: free ports, readiness waits, Redis, cleanup."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

# The start-and-wait helper is the tests' (tests/server_process.py): one for both.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The checkout ahead of tests/: its folders (tests/tenancy, tests/engine, ...) would otherwise be
# found as namespace packages before the installed ones.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from server_process import free_port, start_logged, wait_healthy


class Processes:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._names: dict[int, str] = {}  # pid -> the name its log is under
        self.cleanups: list[Callable[[], None]] = []  # run by stop(), after the processes end

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def start(
        self, name: str, args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        proc = start_logged(args, self.log_path(name), env=env, cwd=cwd)
        self.procs.append(proc)
        self._names[proc.pid] = name
        return proc

    def wait_ready(self, proc: subprocess.Popen[bytes], url: str, timeout_s: float = 120.0) -> None:
        """Until `url` answers 200; ends at once, with the end of its log, if `proc` (started
        here) exits first."""
        log_path = self.log_path(self._names[proc.pid])
        wait_healthy(url, proc, log_path, timeout_s=timeout_s, interval_s=0.1)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for cleanup in reversed(self.cleanups):
            cleanup()


def postgres_database(procs: Processes) -> str:
    """A fresh database (its SQLAlchemy URL) on DATABASE_URL's server, else the local one on
    5432 (trust auth, user postgres), dropped when `procs` stops."""
    import asyncpg

    server = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    server = server.replace("postgresql+asyncpg://", "postgresql://")
    name = f"lgbench_{uuid.uuid4().hex[:12]}"

    async def execute(sql: str) -> None:
        conn = await asyncpg.connect(server)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(execute(f'CREATE DATABASE "{name}"'))
    procs.cleanups.append(lambda: asyncio.run(execute(f'DROP DATABASE IF EXISTS "{name}"')))
    return server.replace("postgresql://", "postgresql+asyncpg://").rsplit("/", 1)[0] + "/" + name


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

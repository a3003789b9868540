"""Real Redis and PostgreSQL servers for any test package (imported by tests/conftest.py).

REDIS_URL / DATABASE_URL point at existing servers when set; otherwise a private server is
started on a free loopback port for the session. The tenancy tests keep their own copies of these
fixtures in tests/tenancy/conftest.py (nearer fixtures win there); the gateway and e2e tests use
these.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from server_process import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"server on port {port} did not start")


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    if shutil.which("redis-server") is None:
        pytest.skip("no REDIS_URL and no redis-server binary on PATH")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="lg-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_port(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def redis_prefix(redis_server_url: str) -> Iterator[str]:
    """A key prefix private to this test; its keys (and only those) are deleted afterwards."""
    prefix = f"lgtest:{uuid.uuid4().hex[:12]}:"
    yield prefix
    delete_redis_keys(redis_server_url, prefix)


def delete_redis_keys(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        batch = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(batch), 500):
            client.delete(*batch[i : i + 500])
    finally:
        client.close()


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """A URL (postgresql+asyncpg://...) to a server where the tests may create databases."""
    if os.environ.get("DATABASE_URL"):
        url = os.environ["DATABASE_URL"]
        for plain in ("postgresql://", "postgres://"):
            if url.startswith(plain):
                url = "postgresql+asyncpg://" + url[len(plain) :]
        yield url
        return
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no DATABASE_URL and no PostgreSQL binaries under {PG_BIN}")
    port = free_port()
    root = Path(tempfile.mkdtemp(prefix="lg-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, user="postgres")
    subprocess.run(
        _as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres",
                      "--auth=trust", "-E", "UTF8", "--no-sync"]),
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", opts,
                      "-l", str(root / "log"), "-w", "start"]),
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            check=False, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


async def create_database(server_url: str) -> str:
    """A fresh, empty database on the server at `server_url` (postgresql+asyncpg://); its URL."""
    import asyncpg

    name = f"lgtest_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(server_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return f"{server_url.rpartition('/')[0]}/{name}"


async def drop_database(server_url: str, url: str) -> None:
    import asyncpg

    name = url.rpartition("/")[2]
    conn = await asyncpg.connect(server_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


# ---- servers a test may stop and start again (availability tests) -------------------------------


class KillableRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="lg-gw-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class KillablePostgres:
    """A private PostgreSQL cluster on a free port: `stop()` takes it down at once (as a crash
    would), `start()` brings the same data back."""

    def __init__(self) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="lg-pg-kill-"))
        self.data = self.root / "data"
        if os.geteuid() == 0:
            shutil.chown(self.root, user="postgres")
        subprocess.run(
            _as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                          "--auth=trust", "-E", "UTF8", "--no-sync"]),
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", opts,
                          "-l", str(self.root / "log"), "-w", "start"]),
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self) -> None:
        subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                          "-w", "stop"]),
            check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


# ---- fixtures over the helpers above (registered by tests/conftest.py) ---------------------------


@pytest.fixture
async def postgres_url(postgres_server_url: str) -> AsyncIterator[str]:
    """A fresh, empty database for this test, dropped afterwards."""
    url = await create_database(postgres_server_url)
    yield url
    await drop_database(postgres_server_url, url)


@pytest.fixture
def killable_redis() -> Iterator[KillableRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not on PATH: this test must kill its own Redis")
    server = KillableRedis()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def killable_postgres() -> Iterator[KillablePostgres]:
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL binaries under {PG_BIN}: this test must kill its own server")
    server = KillablePostgres()
    server.start()
    yield server
    server.remove()

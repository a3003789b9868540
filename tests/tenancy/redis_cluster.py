"""A real three-master Redis Cluster on loopback: `redis-server --cluster-enabled yes` three times,
joined by `redis-cli --cluster create` (no replicas), for the cluster tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

NUM_MASTERS = 3


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_node_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free as well."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 < 65536 and _is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


@dataclass
class RedisClusterNodes:
    ports: list[int]

    @property
    def url(self) -> str:
        """One node's URL: the cluster client discovers the others from it."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"


def _cli(port: int, *args: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=30
    )
    return done.stdout


@contextmanager
def redis_cluster() -> Iterator[RedisClusterNodes]:
    root = Path(tempfile.mkdtemp(prefix="lg-redis-cluster-"))
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        for _ in range(NUM_MASTERS):
            port = _free_node_port()
            workdir = root / str(port)
            workdir.mkdir()
            procs.append(
                subprocess.Popen(
                    [
                        "redis-server",
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(workdir),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            ports.append(port)
        deadline = time.monotonic() + 20
        while not all("PONG" in _cli(p, "ping") for p in ports):
            if time.monotonic() > deadline:
                raise RuntimeError("cluster nodes did not start")
            time.sleep(0.05)
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        while not all("cluster_state:ok" in _cli(p, "cluster", "info") for p in ports):
            if time.monotonic() > deadline + 40:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        yield RedisClusterNodes(ports)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)

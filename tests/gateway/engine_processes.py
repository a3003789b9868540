"""Real engine server processes (`loragate engine`) on free loopback ports."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from server_process import free_port, start_logged, wait_healthy

BIN = Path(sys.executable).parent
STARTUP_TIMEOUT_S = 180.0  # for all of them: they start at once


@dataclass
class EngineProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def session_tuning_file() -> list[str]:
    """The test run's tuning file (tests/conftest.py) as `loragate engine` takes it; a test's own
    --tuning-file, given after it, wins."""
    path = os.environ.get("LORAGATE_ENGINE__TUNING_FILE")
    return [] if path is None else ["--tuning-file", path]


def start_engines(
    model_dir: Path,
    workdir: Path,
    count: int,
    *args: str,
    env: dict[str, str] | None = None,
    own_cwd: bool = False,
    per_engine: Callable[[int], list[str]] | None = None,
) -> list[EngineProcess]:
    """`count` engines on this machine's cores, which they share with the gateways and the test:
    each gets an even share of torch threads (at least one), as a deployment of several engines
    per machine would set `--threads`. At the default (every core each) their OpenMP teams
    oversubscribe the cores and every step slows down. `own_cwd`: each runs in a fresh
    directory of its own under `workdir` (sharing no files with anything else); `per_engine`:
    the i-th engine's extra arguments."""
    threads = max(1, (os.cpu_count() or 1) // count)
    engines = []
    try:
        for i in range(count):
            port = free_port()
            log_path = workdir / f"engine-{port}.log"
            cwd = workdir / f"engine-{port}" if own_cwd else None
            if cwd is not None:
                cwd.mkdir()
            extra = per_engine(i) if per_engine is not None else []
            proc = start_logged(
                [str(BIN / "loragate"), "engine", "--model", str(model_dir), "--port", str(port),
                 "--served-model-name", "tiny", "--num-kv-blocks", "512", "--max-num-seqs", "16",
                 "--threads", str(threads), *session_tuning_file(), *args, *extra],
                log_path, env=env, cwd=cwd,
            )  # fmt: skip
            engines.append(EngineProcess(f"http://127.0.0.1:{port}", proc, log_path))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for engine in engines:
            wait_healthy(
                engine.url + "/health", engine.proc, engine.log_path,
                timeout_s=max(0.0, deadline - time.monotonic()),
            )  # fmt: skip
    except BaseException:
        for engine in engines:  # one that failed to start leaves none behind
            engine.kill()
        raise
    return engines

"""A server process on loopback, for the tests and the benchmarks alike: start it with its output
in a log file (`start_logged`), then poll its health URL until it answers 200 (`wait_healthy`).
When the process exits first, or the time runs out, the wait raises `StartupError` with the end
of that log: an engine that cannot load its model says why there and nowhere else.

Starting and waiting are apart so that several servers start at once and are waited for in turn
(their start-ups overlap). Used by tests/gateway/engine_processes.py, tests/vllm_servers.py,
tests/chaos/deployment.py, bench/gateway_processes.py and bench/latency.py. The tests reach it by
name (tests/conftest.py puts this folder on sys.path); a benchmark puts tests/ on its path first,
as bench/gateway_vllm.py does for tests/vllm_servers.py.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

LOG_TAIL_CHARS = 3000


class StartupError(RuntimeError):
    """A server exited before it answered its health URL, or did not answer in time."""


def free_port() -> int:
    """A loopback port free now (another process may take it before the server binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_logged(
    argv: list[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """`argv` with stdout and stderr in `log_path`. `new_session`: the process leads a group of
    its own, so that `os.killpg` reaches its children too (vLLM's engine core and worker)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=new_session,
        )


def log_tail(log_path: Path | None) -> str:
    if log_path is None:
        return "(its output was not captured)"
    try:
        return log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError as error:
        return f"(its log {log_path} cannot be read: {error})"


def wait_healthy(
    url: str,
    proc: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
    *,
    timeout_s: float,
    interval_s: float = 0.2,
) -> None:
    """Poll `url` until it answers 200. Raises StartupError, ending with the last of `log_path`,
    once `proc` (when given) has exited or `timeout_s` has passed; polls at least once."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and (code := proc.poll()) is not None:
            raise StartupError(
                f"exited with code {code} before {url} answered; {log_path} ends:\n"
                + log_tail(log_path)
            )
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            raise StartupError(
                f"{url} did not answer 200 within {timeout_s:g} s; {log_path} ends:\n"
                + log_tail(log_path)
            )
        time.sleep(interval_s)

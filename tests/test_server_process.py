"""tests/server_process.py: the wait returns once the server answers, and fails with the end of
its log when the process exits first or never answers."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from server_process import StartupError, free_port, start_logged, wait_healthy


def test_it_returns_once_the_server_answers(tmp_path: Path) -> None:
    port = free_port()
    proc = start_logged(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        tmp_path / "server.log",
        cwd=tmp_path,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/", proc, tmp_path / "server.log", timeout_s=60)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_exits_fails_the_wait_with_its_output(tmp_path: Path) -> None:
    log = tmp_path / "dies.log"
    proc = start_logged(
        [sys.executable, "-c", "import sys; print('no model here', flush=True); sys.exit(3)"], log
    )
    with pytest.raises(StartupError, match="exited with code 3") as caught:
        # the port is never bound: only the exit can end this wait before its limit
        wait_healthy(f"http://127.0.0.1:{free_port()}/health", proc, log, timeout_s=120)
    assert "no model here" in str(caught.value)


def test_a_server_that_never_answers_fails_the_wait_with_its_output(tmp_path: Path) -> None:
    log = tmp_path / "silent.log"
    proc = start_logged(
        [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(600)"], log
    )
    try:
        while "loading" not in log.read_text():  # its output is there before the wait gives up
            assert proc.poll() is None
            time.sleep(0.05)
        with pytest.raises(StartupError, match="did not answer 200") as caught:
            wait_healthy(f"http://127.0.0.1:{free_port()}/health", proc, log, timeout_s=0.2)
        assert "loading" in str(caught.value)
        assert proc.poll() is None  # the caller decides what to do with it
    finally:
        proc.kill()
        proc.wait()

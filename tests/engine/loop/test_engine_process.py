"""`loragate engine` as a real process: the engine loop on the main thread, HTTP beside it
(engine/loop/on_main.py), and what that layout must keep: streams served, SIGTERM draining the
running request before the process ends as a SIGTERMed process does, a taken port failing at
start with uvicorn's status, and the loop running on whichever thread the caller chose.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from engine.config import EngineConfig
from engine.loop.async_engine import AsyncEngine
from engine.loop.llm_engine import LLMEngine
from engine.loop.on_main import STARTUP_FAILURE
from tests.gateway.engine_processes import session_tuning_file, start_engines

BIN = Path(sys.executable).parent
GENERATE = "/inference/v1/generate"


def _start(model_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(BIN / "loragate"), "engine", "--model", str(model_dir), "--port", str(port),
             *session_tuning_file()],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def test_sigterm_mid_stream_drains_then_ends_as_sigtermed(tiny_model_dir: Path, tmp_path: Path):
    (engine,) = start_engines(tiny_model_dir, tmp_path, 1)
    proc, url = engine.proc, engine.url
    try:
        body = {
            "token_ids": [1, 2, 3, 4, 5],
            "sampling_params": {"temperature": 0, "max_tokens": 300, "ignore_eos": True},
            "stream": True,
        }
        tokens: list[int] = []
        finish = None
        with httpx.stream("POST", url + GENERATE, json=body, timeout=60) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:])["choices"]:
                    tokens += choice["token_ids"]
                    finish = choice.get("finish_reason") or finish
                if len(tokens) == 5:
                    proc.send_signal(signal.SIGTERM)  # mid-stream: the drain lets it finish
        assert len(tokens) == 300 and finish == "length"
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        engine.kill()
    log = engine.log_path.read_text()
    assert "Traceback" not in log
    # the start-up choices an operator (or bench/latency.py) reads: which kernels this CPU got
    assert "engine.step.native_matmul: native matmul kernel: " in log


def test_a_taken_port_fails_at_start_with_uvicorns_status(tiny_model_dir: Path, tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _start(tiny_model_dir, port, tmp_path / "engine.log")
        try:
            assert proc.wait(timeout=120) == STARTUP_FAILURE
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "address already in use" in (tmp_path / "engine.log").read_text().lower()


@pytest.mark.parametrize("start_thread", [True, False])
def test_the_loop_runs_on_the_thread_chosen(tiny_model_dir: Path, start_thread: bool):
    llm = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=2))
    engine = AsyncEngine(llm, start_thread=start_thread)
    mine = None
    if not start_thread:
        mine = threading.Thread(target=engine.run_loop, name="chosen")
        mine.start()

    async def ask() -> str:
        name = await engine.run_in_loop(lambda _: threading.current_thread().name)
        if start_thread and Path("/proc/self/task").is_dir():
            # named for the kernel too (`top -H`), which tests/e2e/test_serve_threads.py reads
            os_names = [(t / "comm").read_text().strip() for t in Path("/proc/self/task").iterdir()]
            assert "engine-loop" in os_names
        assert engine.is_healthy
        await engine.shutdown(drain_timeout_s=0)
        assert not engine.is_healthy  # the loop has ended
        return name

    name = asyncio.run(ask())
    assert name == ("engine-loop" if start_thread else "chosen")
    if mine is not None:
        mine.join(timeout=10)
        assert not mine.is_alive()

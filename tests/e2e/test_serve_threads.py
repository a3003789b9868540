"""`loragate serve` with the embedded engine steps it on the process's main thread and serves
HTTP from a thread of its own (gateway/engines/inprocess.py, MainThreadEngine): a decode step
stepped from any other thread ran 1.6x slower (bench/RESULTS.md). Seen from outside, through
the kernel's list of the process's threads; SIGTERM still ends the process as SIGTERM, cleanly.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from tests.e2e.gateway_process import gateway_env, start_gateway


def thread_names(pid: int) -> list[str]:
    return [(task / "comm").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir()]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_embedded_engine_steps_on_the_main_thread(tiny_model_dir: Path, tmp_path: Path) -> None:
    gateway = start_gateway(gateway_env(tiny_model_dir, tmp_path), tmp_path)
    try:
        tenant = gateway.tenant()
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        headers = {"Authorization": f"Bearer {tenant.key}"}
        answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] >= 1
        names = thread_names(gateway.proc.pid)
        assert "http" in names  # uvicorn's thread (engine/loop/on_main.py names it)
        assert "engine-loop" not in names  # AsyncEngine's own loop thread never started
    finally:
        gateway.proc.send_signal(signal.SIGTERM)
        code = gateway.proc.wait(timeout=60)
    log = gateway.log_text()
    assert code == -signal.SIGTERM, log[-2000:]
    assert "Traceback" not in log

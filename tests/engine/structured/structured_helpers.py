"""Drive an LLMEngine with structured-output requests and read the answers back as text."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from transformers import AutoTokenizer

from engine.loop.llm_engine import LLMEngine
from engine.outputs import FinishReason, PositionLogprobs
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredOutputsParams, StructuredSpec, to_structured_spec

CHAT_PROMPT = "<|im_start|>user\nAnswer in JSON.<|im_end|>\n<|im_start|>assistant\n"


def spec(compact: bool = True, **wire: Any) -> StructuredSpec:
    """A validated spec from vLLM's wire fields (`json=...`, `regex=...`, ...)."""
    fields = {("json" if k == "json_" else k): v for k, v in wire.items()}
    return to_structured_spec(
        StructuredOutputsParams.model_validate({**fields, "disable_any_whitespace": compact})
    )


@dataclass
class Choice:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    finish: FinishReason | None = None


@dataclass
class Answers:
    choices: dict[tuple[str, int], Choice] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def of(self, rid: str, index: int = 0) -> Choice:
        return self.choices[(rid, index)]


def run(engine: LLMEngine, requests: list[EngineRequest], max_steps: int = 5000) -> Answers:
    """Add every request, step until all finish, collect tokens, logprobs and finishes."""
    for request in requests:
        engine.add_request(request)
    answers = Answers()
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.error is not None:
                answers.errors[out.request_id] = out.error
            for c in out.choices:
                choice = answers.choices.setdefault((out.request_id, c.index), Choice())
                choice.token_ids.extend(c.token_ids)
                choice.logprobs.extend(c.logprobs or [])
                if c.finish_reason is not None:
                    choice.finish = c.finish_reason
    assert not engine.has_unfinished_requests(), "requests still running after max_steps"
    engine.check_invariants()
    return answers


def request(
    rid: str,
    prompt: list[int],
    structured: StructuredSpec | None,
    *,
    adapter: str | None = None,
    **params: Any,
) -> EngineRequest:
    """Greedy with room for any answer of tests/structured_cases.py unless params say so."""
    sampling = {"max_tokens": 320, "temperature": 0.0, **params}
    return EngineRequest(
        request_id=RequestId(rid),
        prompt_token_ids=tuple(prompt),
        sampling_params=SamplingParams(structured_outputs=structured, **sampling),
        adapter_name=adapter,
    )


class Text:
    """The model's tokenizer, for prompts and for reading answers back."""

    def __init__(self, model_dir: Any) -> None:
        self.hf = AutoTokenizer.from_pretrained(str(model_dir))

    def prompt(self, text: str = CHAT_PROMPT) -> list[int]:
        ids: list[int] = self.hf.encode(text, add_special_tokens=False)
        return ids

    def decode(self, ids: list[int]) -> str:
        text: str = self.hf.decode(ids, skip_special_tokens=True)
        return text

    def json(self, ids: list[int]) -> Any:
        return json.loads(self.decode(ids))

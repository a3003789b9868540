"""Structured outputs in the synchronous engine: every answer matches its grammar, beside
adapters, plain rows, preemption, chunked prefill, n > 1, penalties and logprobs."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from engine.config import EngineConfig, LoraModule
from engine.errors import InvalidRequestError
from engine.loop.llm_engine import LLMEngine
from engine.outputs import FinishReason
from tests.engine.structured.structured_helpers import Text, request, run, spec
from tests.lora.peft_builders import AdapterSpec, make_peft_adapter
from tests.structured_cases import SCHEMAS


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("structured-adapters")
    specs = [
        AdapterSpec("sql", r=8, alpha=16, seed=21, b_std=0.05),
        AdapterSpec("chat", r=16, alpha=16, targets=["q_proj", "v_proj"], seed=22, b_std=0.05),
    ]
    return {s.name: make_peft_adapter(tiny_model_dir, root / s.name, s) for s in specs}


def make_engine(model_dir: Path, adapters: dict[str, Path], **config: object) -> LLMEngine:
    settings: dict[str, object] = {
        "model": str(model_dir),
        "served_model_name": "tiny",
        "num_kv_blocks": 512,
        "max_num_seqs": 32,
        "prefill_attention": "sdpa",
        "lora_modules": tuple(LoraModule(name, str(path)) for name, path in adapters.items()),
        **config,
    }
    return LLMEngine(EngineConfig(**settings))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, adapters: dict[str, Path]) -> Iterator[LLMEngine]:
    yield make_engine(tiny_model_dir, adapters)


@pytest.fixture(scope="module")
def text(tiny_model_dir: Path) -> Text:
    return Text(tiny_model_dir)


def test_every_schema_validates_greedy_and_sampled_beside_two_adapters(engine, text):
    prompt = text.prompt()
    adapters = [None, "sql", "chat"]
    requests = [
        request(
            name,
            prompt,
            spec(json_=schema),
            adapter=adapters[i % 3],
            temperature=[0.0, 1.0][i % 2],
            seed=i,
            n=2,
        )
        for i, (name, schema) in enumerate(SCHEMAS.items())
    ]
    answers = run(engine, requests)
    assert len(answers.choices) == 2 * len(SCHEMAS)
    for (name, index), choice in answers.choices.items():
        assert choice.finish == FinishReason.STOP, (name, index, text.decode(choice.token_ids))
        jsonschema.validate(text.json(choice.token_ids), SCHEMAS[name])


def test_grammar_rows_leave_the_other_rows_of_the_batch_alone(engine, text):
    prompts = [text.prompt(f"<|im_start|>user\nstory {i}<|im_end|>\n") for i in range(3)]
    alone = run(engine, [request(f"p{i}", p, None, max_tokens=24) for i, p in enumerate(prompts)])
    mixed = run(
        engine,
        [request(f"p{i}", p, None, max_tokens=24) for i, p in enumerate(prompts)]
        + [
            request(f"g{i}", p, spec(json_=SCHEMAS["nested"]), adapter="sql")
            for i, p in enumerate(prompts)
        ],
    )
    for i in range(3):
        assert mixed.of(f"p{i}").token_ids == alone.of(f"p{i}").token_ids
        jsonschema.validate(text.json(mixed.of(f"g{i}").token_ids), SCHEMAS["nested"])


def test_a_preempted_request_resumes_its_grammar_exactly(tiny_model_dir, adapters, text):
    """Preemption recomputes the KV cache but keeps the sampled tokens, and the matcher that
    consumed them: the answers equal those of a run with room for everything."""
    prompt = text.prompt()
    names = ["flat", "nested", "array_of_objects", "deep_nesting", "matrix", "tuple"]

    def answers(num_kv_blocks: int) -> tuple[dict[str, list[int]], int]:
        engine = make_engine(tiny_model_dir, adapters, num_kv_blocks=num_kv_blocks)
        got = run(engine, [request(n, prompt, spec(json_=SCHEMAS[n])) for n in names])
        return {n: got.of(n).token_ids for n in names}, engine.scheduler.num_preemptions

    roomy, roomy_preemptions = answers(512)
    tight, tight_preemptions = answers(8)
    assert roomy_preemptions == 0 and tight_preemptions > 0
    assert tight == roomy
    for name in names:
        jsonschema.validate(text.json(tight[name]), SCHEMAS[name])


def test_a_long_prompt_in_chunks_gives_the_same_answer(tiny_model_dir, adapters, text):
    prompt = text.prompt("<|im_start|>user\n" + "tell me more " * 120 + "<|im_end|>\n")
    structured = spec(json_=SCHEMAS["nested"])
    whole = run(make_engine(tiny_model_dir, adapters), [request("r", prompt, structured)])
    chunked_engine = make_engine(tiny_model_dir, adapters, max_num_batched_tokens=64)
    chunked = run(chunked_engine, [request("r", prompt, structured)])
    assert len(prompt) > 64 * 4
    assert chunked.of("r").token_ids == whole.of("r").token_ids
    jsonschema.validate(text.json(chunked.of("r").token_ids), SCHEMAS["nested"])


def test_n_choices_walk_their_own_grammars_with_penalties(engine, text):
    structured = spec(json_=SCHEMAS["array_of_objects"])
    got = run(
        engine,
        [
            request(
                "r",
                text.prompt(),
                structured,
                n=6,
                temperature=1.0,
                seed=5,
                repetition_penalty=1.3,
                presence_penalty=0.5,
                frequency_penalty=0.5,
            )
        ],
    )
    answers = [text.decode(got.of("r", i).token_ids) for i in range(6)]
    for i in range(6):
        jsonschema.validate(text.json(got.of("r", i).token_ids), SCHEMAS["array_of_objects"])
    assert len(set(answers)) > 1


def test_logprobs_are_those_of_the_constrained_distribution(engine, text):
    choices = ["alpha", "beta", "gamma"]
    got = run(
        engine,
        [request("r", text.prompt(), spec(choice=choices), logprobs=5, temperature=1.0, seed=3)],
    )
    choice = got.of("r")
    assert text.decode(choice.token_ids) in choices
    first = choice.logprobs[0]
    # every top entry is a token some choice can start with, and the probabilities of the
    # allowed first tokens (no more than 5 here) sum to 1: nothing else had any mass
    allowed_first = {c[:n] for c in choices for n in range(1, len(c) + 1)}
    tops = [text.decode([t.token_id]) for t in first.top]
    assert tops and all(top in allowed_first for top in tops)
    assert math.isclose(sum(math.exp(t.logprob) for t in first.top), 1.0, rel_tol=1e-4)
    assert all(math.isfinite(p.chosen.logprob) for p in choice.logprobs)


def test_max_tokens_reached_mid_json_answers_length(engine, text):
    got = run(engine, [request("r", text.prompt(), spec(json_=SCHEMAS["nested"]), max_tokens=6)])
    assert got.of("r").finish == FinishReason.LENGTH
    assert len(got.of("r").token_ids) == 6


def test_choice_regex_grammars_json_object_and_structural_tag(engine, text):
    prompt = text.prompt()
    lark = 'start: "move " DIR " " NUM\nDIR: "north" | "south"\nNUM: /[1-9]/\n'
    gbnf = 'root ::= "go " ("left" | "right")'
    tag = {
        "triggers": ["<f="],
        "structures": [{"begin": "<f=add>", "schema": SCHEMAS["array_bounds"], "end": "</f>"}],
    }
    requests = [
        request("choice", prompt, spec(choice=["yes", "no", "maybe"]), temperature=1.0, seed=1),
        request("regex", prompt, spec(regex=r"[A-Z]{2}[0-9]{3}"), temperature=1.0, seed=2),
        request("lark", prompt, spec(grammar=lark), temperature=1.0, seed=3),
        request("gbnf", prompt, spec(grammar=gbnf), temperature=1.0, seed=4),
        request("object", prompt, spec(json_object=True), temperature=1.0, seed=5),
        request("tag", prompt, spec(structural_tag=tag), max_tokens=40, temperature=1.0, seed=6),
    ]
    got = run(engine, requests)
    assert text.decode(got.of("choice").token_ids) in ("yes", "no", "maybe")
    assert re.fullmatch(r"[A-Z]{2}[0-9]{3}", text.decode(got.of("regex").token_ids))
    assert re.fullmatch(r"move (north|south) [1-9]", text.decode(got.of("lark").token_ids))
    assert text.decode(got.of("gbnf").token_ids) in ("go left", "go right")
    # any object: on a random-weight model it may run past max_tokens (its strings and numbers
    # are unbounded), and then it is a cut-off object, never anything else
    if got.of("object").finish == FinishReason.STOP:
        assert isinstance(text.json(got.of("object").token_ids), dict)
    else:
        assert text.decode(got.of("object").token_ids).startswith("{")
    # free text, and wherever the trigger starts a structure, the structure in full
    tagged = text.decode(got.of("tag").token_ids)
    for match in re.finditer(r"<f=", tagged):
        rest = tagged[match.start() :]
        if got.of("tag").finish == FinishReason.STOP or "</f>" in rest:
            assert rest.startswith("<f=add>[")
    for rid in ("choice", "regex", "lark", "gbnf"):
        assert got.of(rid).finish == FinishReason.STOP


def test_compiled_grammars_are_cached_shared_and_failures_remembered(engine, text):
    compiler = engine.grammars
    structured = spec(json_={"type": "object", "properties": {"k": {"enum": [1, 2, 3]}}})
    before = compiler.num_compiles
    run(engine, [request(f"r{i}", text.prompt(), structured, temperature=1.0) for i in range(4)])
    assert compiler.num_compiles == before + 1
    # the whitespace option is part of the key: another compile
    loose = spec(compact=False, json_={"type": "object", "properties": {"k": {"enum": [1, 2, 3]}}})
    run(engine, [request("loose", text.prompt(), loose)])
    assert compiler.num_compiles == before + 2
    bad = spec(json_={"type": "object", "properties": {"k": {"$ref": "#/nowhere"}}})
    compiles = []
    for _ in range(3):
        with pytest.raises(InvalidRequestError) as info:
            engine.add_request(request("bad", text.prompt(), bad))
        assert info.value.param == "sampling_params.structured_outputs.json"
        assert "nowhere" in info.value.message
        compiles.append(compiler.num_compiles)
    assert compiles[0] <= before + 3 and compiles[1] == compiles[2] == compiles[0]


def test_grammar_steps_keep_the_native_decode_step(tiny_model_dir, text):
    """The mask is applied to the logits, after the forward: decode steps of grammar requests
    still run in the one native call where the engine has it."""
    engine = make_engine(tiny_model_dir, {}, enable_lora=False, dtype="bfloat16")
    step = engine.runner.native_step
    if step is None:
        pytest.skip("no native decode step on this machine (its kernels did not build)")
    calls = 0
    forward = step.forward

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return forward(*args, **kwargs)

    step.forward = counting  # type: ignore[method-assign]
    got = run(engine, [request("r", text.prompt(), spec(json_=SCHEMAS["nested"]))])
    num_tokens = len(got.of("r").token_ids)
    assert num_tokens > 10
    assert calls == num_tokens - 1  # every step after the prefill
    jsonschema.validate(text.json(got.of("r").token_ids), SCHEMAS["nested"])

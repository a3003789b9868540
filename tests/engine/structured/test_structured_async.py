"""Structured outputs through the AsyncEngine on the tiny model: a grammar compiles off the loop,
holding no batch slot; a compile past the timeout or past llguidance's limits fails its request
alone (a 400 naming the field) while other requests are served; concurrent requests share one
compile; cancelled grammar requests leave nothing behind.

Compiles are held deterministically by a gate on the compiler's worker (`Gate`): a test waits
on events and futures, never on the clock. The module's engine has one batch slot."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import pytest_asyncio

from engine.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.loop.async_engine import AsyncEngine
from engine.loop.llm_engine import LLMEngine
from engine.outputs import FinishReason, RequestOutput
from engine.protocol import EngineLimits, parse_generate_request, to_engine_request
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams
from engine.structured.compiler import GrammarCompiler
from engine.structured.spec import MAX_JSON_DEPTH, StructuredSpec
from tests.engine.loop.async_helpers import TIMEOUT_S, assert_idle_and_consistent, shut_down_checked
from tests.engine.structured.structured_helpers import Text, request, spec
from tests.structured_cases import SCHEMAS

pytestmark = pytest.mark.asyncio(loop_scope="module")
JSON_PARAM = "sampling_params.structured_outputs.json"
# A gate opens by itself after this long, so a failing test cannot hang the worker (or the
# interpreter's exit, which joins it); every test opens its gates long before.
GATE_SAFETY_S = 300
_ids = itertools.count()


def make_engine(model_dir: Path, **overrides: Any) -> LLMEngine:
    settings = {"num_kv_blocks": 256, "max_num_seqs": 1, "enable_lora": False, **overrides}
    return LLMEngine(EngineConfig(model=str(model_dir), prefill_attention="sdpa", **settings))


@pytest.fixture(scope="module")
def llm_engine(tiny_model_dir: Path) -> LLMEngine:
    return make_engine(tiny_model_dir)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(llm_engine: LLMEngine) -> AsyncIterator[AsyncEngine]:
    # One AsyncEngine for the module: its shutdown also shuts the compiler's workers down.
    async_engine = AsyncEngine(llm_engine)
    yield async_engine
    await shut_down_checked(async_engine, llm_engine)


@pytest_asyncio.fixture(loop_scope="module")
async def engine(shared: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    yield shared
    await assert_idle_and_consistent(shared)


@pytest.fixture(scope="module")
def text(tiny_model_dir: Path) -> Text:
    return Text(tiny_model_dir)


# ---- helpers ---------------------------------------------------------------------------------


@dataclass
class Gate:
    """Holds the compile of one spec on the compiler's worker until `release` is set."""

    spec: StructuredSpec
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    stored: threading.Event = field(default_factory=threading.Event)  # outcome cached
    num_builds: int = 0


async def waited(event: threading.Event) -> bool:
    return await asyncio.to_thread(event.wait, TIMEOUT_S)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """gate(compiler, spec) -> Gate; every gate is opened when the test ends."""
    gates: list[Gate] = []

    def install(compiler: GrammarCompiler, structured: StructuredSpec) -> Gate:
        held = Gate(structured)
        real = compiler._build_and_store  # the worker's task: build, then cache the outcome

        def gated(s: StructuredSpec) -> Any:
            if s != held.spec:
                return real(s)
            held.num_builds += 1
            held.entered.set()
            held.release.wait(GATE_SAFETY_S)
            try:
                return real(s)
            finally:
                held.stored.set()

        monkeypatch.setattr(compiler, "_build_and_store", gated)
        gates.append(held)
        return held

    yield install
    for held in gates:
        held.release.set()


@dataclass
class Answer:
    tokens: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    error: str | None = None


async def collect(outputs: AsyncIterator[RequestOutput]) -> Answer:
    answer = Answer()
    async with asyncio.timeout(TIMEOUT_S):
        async for output in outputs:
            answer.error = output.error or answer.error
            for choice in output.choices:
                answer.tokens.extend(choice.token_ids)
                answer.finish = choice.finish_reason or answer.finish
    return answer


async def generate(engine: AsyncEngine, req: EngineRequest) -> Answer:
    return await collect(await engine.generate(req))


def plain(max_tokens: int = 12) -> EngineRequest:
    return EngineRequest(
        request_id=RequestId(f"plain-{next(_ids)}"),
        prompt_token_ids=(1, 2, 3, 4, 5),
        sampling_params=SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
    )


def grammar(text: Text, structured: StructuredSpec, **params: Any) -> EngineRequest:
    return request(f"grammar-{next(_ids)}", text.prompt(), structured, **params)


def tagged(schema: dict[str, Any], tag: str) -> dict[str, Any]:
    """The schema under a spec of its own (a cache miss), generating the same answers."""
    return {**schema, "description": tag}


def assert_plain_done(answer: Answer, max_tokens: int = 12) -> None:
    assert answer.error is None
    assert (answer.finish, len(answer.tokens)) == (FinishReason.LENGTH, max_tokens)


# ---- compiling off the loop ------------------------------------------------------------------


async def test_a_compiling_request_holds_no_slot_and_the_loop_keeps_serving(
    engine: AsyncEngine, llm_engine: LLMEngine, text: Text, gate: Any
) -> None:
    assert engine.config.max_num_seqs == 1
    schema = tagged(SCHEMAS["flat"], "no-slot")
    held = gate(llm_engine.grammars, spec(json_=schema))
    structured = asyncio.create_task(generate(engine, grammar(text, held.spec)))
    assert await waited(held.entered)
    # waiting for its grammar outside the engine: neither running nor queued
    assert await engine.run_in_loop(lambda e: e.num_unfinished_requests()) == 0
    # the one slot is free: a plain request runs to its end meanwhile
    assert_plain_done(await generate(engine, plain()))
    assert not structured.done()
    held.release.set()
    answer = await structured
    assert answer.finish == FinishReason.STOP and answer.error is None
    jsonschema.validate(text.json(answer.tokens), schema)


async def test_a_compile_past_the_timeout_fails_alone_and_lands_in_the_cache(
    tiny_model_dir: Path, text: Text, gate: Any
) -> None:
    llm_engine = make_engine(tiny_model_dir, grammar_compile_timeout_s=0.25)
    engine = AsyncEngine(llm_engine)
    try:
        compiler = llm_engine.grammars
        schema = tagged(SCHEMAS["nested"], "timeout")
        held = gate(compiler, spec(json_=schema))
        running = await engine.generate(plain(max_tokens=40))
        with pytest.raises(InvalidRequestError) as info:
            await asyncio.wait_for(engine.add_request(grammar(text, held.spec)), TIMEOUT_S)
        assert info.value.param == JSON_PARAM
        assert "took longer than 0.25 s" in info.value.message
        assert_plain_done(await collect(running), max_tokens=40)
        assert await waited(held.entered) and not held.stored.is_set()

        # the compile goes on in the background; its grammar is cached when it ends
        before = compiler.num_compiles
        held.release.set()
        assert await waited(held.stored)
        assert compiler.num_compiles == before + 1
        answer = await generate(engine, grammar(text, held.spec))
        assert compiler.num_compiles == before + 1 and held.num_builds == 1
        assert answer.finish == FinishReason.STOP
        jsonschema.validate(text.json(answer.tokens), schema)
        await assert_idle_and_consistent(engine)
    finally:
        await shut_down_checked(engine, llm_engine)


async def test_concurrent_requests_for_one_uncached_spec_share_one_compile(
    engine: AsyncEngine, llm_engine: LLMEngine, text: Text, gate: Any
) -> None:
    compiler = llm_engine.grammars
    schema = tagged(SCHEMAS["enum"], "shared")
    held = gate(compiler, spec(json_=schema))
    before = compiler.num_compiles
    tasks = [asyncio.create_task(generate(engine, grammar(text, held.spec))) for _ in range(4)]
    assert await waited(held.entered)
    assert not any(task.done() for task in tasks)
    assert compiler.num_compiles == before  # every request is waiting for the one compile
    held.release.set()
    answers = await asyncio.gather(*tasks)
    assert compiler.num_compiles == before + 1 and held.num_builds == 1
    for answer in answers:
        assert answer.finish == FinishReason.STOP
        assert answer.tokens == answers[0].tokens  # greedy: one grammar, one answer
        jsonschema.validate(text.json(answer.tokens), schema)


# ---- schemas that explode the grammar (SECURITY.md: bounded, and failing alone) ---------------


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": 9}
    for _ in range(levels):
        schema = {
            "type": "object",
            "properties": {"a": schema},
            "required": ["a"],
            "additionalProperties": False,
        }
    return schema


HOSTILE: dict[str, dict[str, Any]] = {
    # two JSON levels a step: one past MAX_JSON_DEPTH, refused before anything compiles
    "too_deep": _nested(MAX_JSON_DEPTH // 2),
    "enum_100k": {"enum": [f"value-{i}" for i in range(100_000)]},
    "properties_25k": {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(25_000)},
    },
    "deep_but_allowed": _nested(30),  # 62 JSON levels
}


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


async def _submit_body(engine: AsyncEngine, schema: dict[str, Any]) -> Answer:
    """The path of a server's body: parse, validate, admit (compiling), generate."""
    body = {
        "request_id": f"hostile-{next(_ids)}",
        "token_ids": [1, 2, 3],
        "sampling_params": {
            "temperature": 0.0,
            "max_tokens": 320,
            "structured_outputs": {"json": schema, "disable_any_whitespace": True},
        },
    }
    limits = EngineLimits(
        vocab_size=engine.vocab_size,
        max_model_len=engine.max_model_len,
        base_model_name=engine.model_name,
    )
    req = to_engine_request(parse_generate_request(json.dumps(body)), limits)
    return await generate(engine, req)


async def test_schemas_that_explode_the_grammar_fail_alone_and_stay_bounded(
    engine: AsyncEngine, text: Text
) -> None:
    # the tokenizer is loaded on the first compile: load it before the baseline
    assert (await generate(engine, grammar(text, spec(choice=["warm", "up"])))).error is None
    rss_before = _rss_kib()
    for name, schema in HOSTILE.items():
        running = await engine.generate(plain(max_tokens=24))
        try:
            answer = await _submit_body(engine, schema)
        except InvalidRequestError as exc:
            assert exc.param == JSON_PARAM, name
            assert exc.status_code == 400
            expected = {
                "too_deep": f"nests deeper than {MAX_JSON_DEPTH} levels",
                "enum_100k": "too big|took longer",
                "properties_25k": "too large|too big|took longer",
                "deep_but_allowed": "does not compile|took longer",
            }[name]
            assert any(part in exc.message for part in expected.split("|")), (name, exc.message)
        else:
            assert name == "deep_but_allowed", f"{name} was accepted"
            assert answer.finish == FinishReason.STOP and answer.error is None
            jsonschema.validate(text.json(answer.tokens), schema)
        assert_plain_done(await collect(running), max_tokens=24)
    assert _rss_kib() - rss_before < 1 << 20  # KiB: under 1 GiB for all of them together


# ---- cancellation ----------------------------------------------------------------------------


async def test_grammar_requests_cancelled_at_every_stage_leave_the_engine_clean(
    engine: AsyncEngine, llm_engine: LLMEngine, text: Text, gate: Any
) -> None:
    """Cancelled while compiling, waiting for the one slot, or decoding under their grammar."""
    held = gate(llm_engine.grammars, spec(json_=tagged(SCHEMAS["nested"], "cancelled")))
    compiling = [asyncio.create_task(generate(engine, grammar(text, held.spec))) for _ in range(3)]
    assert await waited(held.entered)
    names = ["nested", "array_of_objects", "deep_nesting", "matrix", "defs_ref", "tuple"]
    streams = [
        await engine.generate(grammar(text, spec(json_=SCHEMAS[name]), max_tokens=320))
        for name in names * 4
    ]
    first = await asyncio.wait_for(anext(streams[0]), TIMEOUT_S)  # decoding now
    assert not first.finished and first.choices[0].token_ids
    # the first decoding (it needs 20+ steps to finish), every other one waiting for the slot
    assert await engine.run_in_loop(lambda e: e.num_unfinished_requests()) >= len(streams) - 1
    for stream in streams:
        await stream.aclose()
    for task in compiling:
        task.cancel()
    results = await asyncio.gather(*compiling, return_exceptions=True)
    assert all(isinstance(result, asyncio.CancelledError) for result in results)
    held.release.set()
    assert await waited(held.stored)
    await assert_idle_and_consistent(engine)
    assert await engine.run_in_loop(lambda e: e.num_unfinished_requests()) == 0
    manager = llm_engine.block_manager
    assert await engine.run_in_loop(lambda e: manager.num_free_blocks) == manager.num_blocks
    # and the engine serves grammar requests as before, the held spec from the cache
    answer = await generate(engine, grammar(text, held.spec))
    assert answer.finish == FinishReason.STOP


async def test_a_structural_tag_holds_its_structure_to_the_schema(
    llm_engine: LLMEngine, text: Text
) -> None:
    tag = {
        "triggers": ["<f="],
        "structures": [{"begin": "<f=add>", "schema": {"type": "integer"}, "end": "</f>"}],
    }
    compiled = await llm_engine.grammars.compile_async(spec(structural_tag=tag))

    def walks(answer: str) -> bool:
        matcher = compiled.new_matcher()
        return all(matcher.accept(t) for t in text.hf.encode(answer, add_special_tokens=False))

    assert walks("sum: <f=add>42</f> done")
    assert not walks('sum: <f=add>{"x": "y"}</f> done')

"""The grammar compiler's two ways of staying out of the engine loop's way: a JSON Schema's grammar
document written around the schema's text (no parse under the GIL), and a compile thread that
lowers its own priority once llguidance's GIL-held parse is behind it."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest

from engine.structured.compiler import CompilerLimits, GrammarCompiler
from engine.structured.spec import (
    StructuredOutputsParams,
    _schema_grammar,
    grammar_text,
    to_structured_spec,
)
from tests.structured_cases import SCHEMAS


def _spec(**fields: object):  # type: ignore[no-untyped-def]
    return to_structured_spec(StructuredOutputsParams.model_validate(fields))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("pattern", [None, "[ ]{0,2}"])
def test_the_grammar_written_around_a_schema_is_the_parsed_one(
    name: str, compact: bool, pattern: str | None
) -> None:
    spec = _spec(json=SCHEMAS[name], disable_any_whitespace=compact, whitespace_pattern=pattern)
    parsed = _schema_grammar(spec, json.loads(spec.source))
    assert json.loads(grammar_text(spec)) == json.loads(parsed)


@pytest.mark.parametrize(
    "fields",
    [
        {"json": {"type": "object", "x-guidance": {"whitespace_flexible": True}}},
        {
            "json": {"type": "object", "properties": {"a": {}}},
            "disable_additional_properties": True,
        },
        {"json": True},
    ],
)
def test_schemas_that_need_their_options_merged_are_parsed(fields: dict[str, object]) -> None:
    spec = _spec(**fields, disable_any_whitespace=True)
    expected = spec.source if fields["json"] is not True else "{}"
    document = json.loads(grammar_text(spec))
    schema = document["grammars"][0]["json_schema"]
    assert schema["x-guidance"]["whitespace_flexible"] is ("x-guidance" in expected)
    if fields.get("disable_additional_properties"):
        assert schema["additionalProperties"] is False


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread priorities here")
def test_a_compile_thread_lowers_itself_after_the_parse(tiny_model_dir: Path) -> None:
    """A compile long enough to outlast the parse ends at the lowered priority; one that ends
    sooner never lowers (the timer is cancelled): the GIL-held parse runs at the caller's."""
    compiler = GrammarCompiler.for_model(tiny_model_dir, 4096, [2], CompilerLimits(compile_nice=3))
    big = _spec(json={"enum": [f"value-{i}" for i in range(20_000)]}, disable_any_whitespace=True)
    small = _spec(json={"type": "integer"}, disable_any_whitespace=True)
    compiler.compile(small)  # loads the tokenizer outside the timed threads
    start = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: dict[str, int] = {}

    def build(name: str, spec: object) -> None:
        compiler._build(spec, lower=3)  # type: ignore[arg-type]
        seen[name] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    for name, spec in (("big", big), ("small", _spec(json={"type": "boolean"}))):
        thread = threading.Thread(target=build, args=(name, spec))
        thread.start()
        thread.join()
    assert seen == {"big": min(start + 3, 19), "small": start}


def test_the_engine_yields_a_core_while_a_grammar_compiles(tiny_model_dir: Path) -> None:
    """With every core in the step, a compile thread delays one of them at each barrier (long
    steps); so while one runs, the step takes one thread fewer, and all of them back after."""
    import torch

    from engine.config import EngineConfig
    from engine.loop.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=64, threads=2))
    gate, entered = threading.Event(), threading.Event()
    build = engine.grammars._build

    def held_build(spec, lower=0):  # type: ignore[no-untyped-def]
        entered.set()
        gate.wait(timeout=60)
        return build(spec, lower)

    engine.grammars._build = held_build  # type: ignore[method-assign]
    spec = _spec(json={"type": "integer"}, disable_any_whitespace=True)
    compiling = threading.Thread(target=lambda: asyncio.run(engine.grammars.compile_async(spec)))
    compiling.start()
    try:
        assert entered.wait(timeout=60)
        assert engine.grammars.cores.num_compiles == 1
        engine.step()
        assert torch.get_num_threads() == 1
    finally:
        gate.set()
        compiling.join()
    assert engine.grammars.cores.num_compiles == 0
    engine.step()
    assert torch.get_num_threads() == 2

"""The grammar compiler's two ways of staying out of the engine loop's way: a JSON Schema's grammar
document written around the schema's text (no parse under the GIL), and a compile thread that
lowers its own priority once llguidance's GIL-held parse is behind it."""

from __future__ import annotations

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

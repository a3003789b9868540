"""`loragate engine` LoRA flags: --lora-modules in its three forms, --max-cpu-loras below
--max-loras refused at start-up, start-up adapters registered (and a bad one refused)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from engine.cli import _engine_config, add_subcommands, parse_lora_modules
from engine.config import EngineConfig, LoraModule
from engine.loop.llm_engine import LLMEngine
from lora.errors import AdapterConfigError
from tests.lora.peft_builders import AdapterSpec, edit_config, make_peft_adapter


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers())
    return parser.parse_args(["engine", "--model", "/models/tiny", *argv])


def test_lora_modules_in_every_form():
    modules = parse_lora_modules(
        [
            "sql=/adapters/sql",
            json.dumps({"name": "chat", "path": "/adapters/chat", "base_model_name": "tiny"}),
            json.dumps([{"name": "a", "path": "/x/a"}, {"name": "b", "path": "/x/b"}]),
        ]
    )
    assert modules == (
        LoraModule("sql", "/adapters/sql"),
        LoraModule("chat", "/adapters/chat", "tiny"),
        LoraModule("a", "/x/a"),
        LoraModule("b", "/x/b"),
    )


@pytest.mark.parametrize(
    "value, words",
    [
        ("no-equals-sign", "name=path"),
        ("=/path", "name=path"),
        ('{"name": "x"', "invalid JSON"),
        ('{"name": "x", "path": "/p", "extra": 1}', "JSON items"),
        ('{"name": "", "path": "/p"}', "non-empty"),
        ('[{"name": "x", "path": "/p", "base_model_name": 3}]', "base_model_name"),
    ],
)
def test_bad_lora_modules_are_refused(value: str, words: str):
    with pytest.raises(ValueError, match=words):
        parse_lora_modules([value])


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="twice"):
        parse_lora_modules(["a=/x", "a=/y"])


def test_flags_reach_the_config():
    args = parse(
        ["--max-loras", "3", "--max-cpu-loras", "5", "--max-lora-rank", "32",
         "--lora-modules", "a=/x", '{"name": "b", "path": "/y"}']
    )  # fmt: skip
    config = _engine_config(args)
    assert (config.max_loras, config.num_cpu_loras(3), config.max_lora_rank) == (3, 5, 32)
    assert [m.name for m in config.lora_modules] == ["a", "b"]
    assert _engine_config(parse(["--max-loras", "6"])).num_cpu_loras(6) == 6
    # Slots from the budget: as many as it holds, at most max_loras.
    assert _engine_config(parse(["--max-loras", "6"])).num_lora_slots(1 << 20) == 6
    sized = _engine_config(parse(["--lora-pool-memory-gb", "0.01"]))
    assert sized.lora_pool_memory_bytes == int(0.01 * (1 << 30))
    assert sized.num_lora_slots(1 << 20) == 10 and sized.num_lora_slots(1) == sized.max_num_seqs
    with pytest.raises(ValueError, match="lora_pool_memory_bytes"):
        sized.num_lora_slots(1 << 30)


def test_max_cpu_loras_below_max_loras_is_a_startup_error():
    with pytest.raises(ValueError, match="max_cpu_loras"):
        _engine_config(parse(["--max-loras", "4", "--max-cpu-loras", "2"]))


def test_startup_adapters_are_registered_and_a_bad_one_stops_startup(
    tiny_model_dir: Path, tmp_path: Path
):
    good = make_peft_adapter(tiny_model_dir, tmp_path / "good", AdapterSpec("good", r=8, alpha=8))
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_model_dir),
            num_kv_blocks=64,
            lora_modules=(LoraModule("good", str(good)),),
        )
    )
    assert engine.lora is not None and [a.name for a in engine.lora.describe()] == ["good"]
    bad = make_peft_adapter(tiny_model_dir, tmp_path / "bad", AdapterSpec("bad", r=8, alpha=8))
    edit_config(bad, use_dora=True)
    with pytest.raises(AdapterConfigError, match="DoRA"):
        LLMEngine(
            EngineConfig(
                model=str(tiny_model_dir),
                num_kv_blocks=64,
                lora_modules=(LoraModule("bad", str(bad)),),
            )
        )

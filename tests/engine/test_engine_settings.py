"""One set of engine options: `loragate engine`'s flags and the gateway's embedded engine
(`LORAGATE_ENGINE__*`) take the same options, and the same values give the same EngineConfig."""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.cli import _engine_config, add_subcommands
from gateway.settings import GatewaySettings

# Options of `loragate engine` that are about the server process, not the engine.
SERVER_ONLY = {
    "help",
    "model",
    "served_model_name",
    "host",
    "port",
    "admin_token_env",
    "otel_endpoint",
    "adapter_source",  # the embedded engine reads the store itself
}

# A value other than the default for every option (lora_modules needs enable_lora).
VALUES = {
    "dtype": "float32", "device": "cpu", "seed": "7", "block_size": "32", "num_kv_blocks": "100",
    "kv_cache_memory_gb": "2.0", "max_num_seqs": "8", "max_num_batched_tokens": "512",
    "max_model_len": "1024", "scheduling_policy": "fcfs", "aging_steps": "9",
    "enable_prefix_caching": "false", "decode_attention": "matmul", "prefill_attention": "sdpa",
    "max_queue_len": "10",
    "enable_lora": "true", "lora_pool_memory_gb": "0.5", "max_loras": "2", "max_cpu_loras": "3",
    "max_lora_rank": "32", "threads": "3", "enforce_eager": "false", "compile_cache_dir": "/tmp/c",
    "prepack_weights": "false", "fused_layer_ops": "false", "native_matmul": "off",
    "native_decode_step": "false", "grammar_cache_entries": "8",
    "grammar_compile_timeout_s": "3.5", "grammar_compile_nice": "0", "tune": "true",
    "tuning_file": "/tmp/tuning.json", "adapter_cache_dir": "/tmp/adapters",
    "adapter_cache_gb": "0.5",
}  # fmt: skip


def _engine_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    add_subcommands(subparsers)
    engine = subparsers.choices["engine"]
    assert isinstance(engine, argparse.ArgumentParser)
    return engine


def test_the_embedded_engine_takes_every_option_the_engine_cli_takes() -> None:
    cli = {action.dest for action in _engine_parser()._actions} - SERVER_ONLY
    engine_settings = GatewaySettings.model_fields["engine"].annotation
    assert engine_settings is not None
    embedded = set(engine_settings.model_fields)
    assert cli == embedded
    assert cli == set(VALUES) | {"lora_modules"}  # this test sets every one of them


def test_the_same_values_give_the_same_engine_config(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = ["--model", str(tiny_model_dir), "--served-model-name", "tiny"]
    for name, value in VALUES.items():
        flag = "--" + name.replace("_", "-")
        if value in ("true", "false"):
            flags.append(flag if value == "true" else "--no-" + flag[2:])
        else:
            flags += [flag, value]
        monkeypatch.setenv("LORAGATE_ENGINE__" + name.upper(), value)
    flags += ["--lora-modules", "pirate=/adapters/pirate"]
    monkeypatch.setenv(
        "LORAGATE_ENGINE__LORA_MODULES", '[{"name":"pirate","path":"/adapters/pirate"}]'
    )
    from_cli = _engine_config(_engine_parser().parse_args(flags))
    settings = GatewaySettings(
        model=tiny_model_dir,
        served_model_name="tiny",
        key_pepper=secrets.token_urlsafe(32),
        salt_secret=secrets.token_urlsafe(32),
    )
    from_gateway = settings.engine.to_engine_config(
        model=str(tiny_model_dir), served_model_name=settings.model_name
    )
    assert from_gateway == from_cli
    assert from_cli.policy == "fcfs" and not from_cli.enable_prefix_caching  # not the defaults


def test_a_bad_engine_option_is_refused_where_it_is_read_naming_it(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LORAGATE_ENGINE__MAX_CPU_LORAS", "1")
    monkeypatch.setenv("LORAGATE_ENGINE__MAX_LORAS", "4")
    with pytest.raises(ValidationError) as caught:
        GatewaySettings(
            model=tiny_model_dir,
            key_pepper=secrets.token_urlsafe(32),
            salt_secret=secrets.token_urlsafe(32),
        )
    assert "max_cpu_loras" in str(caught.value)
    with pytest.raises(ValueError, match="block_size"):
        _engine_config(_engine_parser().parse_args(["--model", "m", "--block-size", "3"]))


def test_engine_help_lists_every_option() -> None:
    """`loragate engine --help` renders (a help string with a stray % or a bad default breaks
    it) and names every option the settings define."""
    text = _engine_parser().format_help()
    for name in VALUES:
        assert "--" + name.replace("_", "-") in text

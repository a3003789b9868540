"""make_model's checkpoint files: byte-for-byte deterministic, and loaded by transformers with
exactly the keys, dtypes and configuration each family expects.

Its tokenizer and chat template are tested in test_make_model_tokenizer.py, the weights' fitness
as a test oracle in test_make_model_oracle.py. Checkpoints come from the session's
`model_factory` (tests/conftest.py), built once per (family, tie).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, PreTrainedModel

from engine.make_model import make_model
from engine.make_model.config import FAMILIES, SIZES, SpecialTokenIds, build_config
from engine.make_model.tokenizer import train_tokenizer
from engine.make_model.weights import count_parameters, init_rule
from tests.conftest import ModelFactory

CHECKPOINT_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


def _load_with_info(path: Path) -> tuple[PreTrainedModel, dict[str, Any]]:
    loaded = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    return cast(tuple[PreTrainedModel, dict[str, Any]], loaded)


def _file_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


# --- determinism -------------------------------------------------------------------------------


def test_same_call_writes_identical_bytes(tmp_path: Path, model_factory: ModelFactory) -> None:
    again = make_model(tmp_path / "again", size="tiny", family="llama")
    first, second = _file_bytes(model_factory(family="llama")), _file_bytes(again)
    assert set(first) == CHECKPOINT_FILES
    assert first.keys() == second.keys()
    for name in first:
        assert first[name] == second[name], name


def test_tokenizer_training_is_deterministic() -> None:
    assert train_tokenizer(4096).to_str() == train_tokenizer(4096).to_str()


def test_tied_and_untied_share_every_common_tensor(model_factory: ModelFactory) -> None:
    # Per-name seeds: dropping lm_head must not shift any other tensor's values.
    with (
        safe_open(model_factory(family="qwen2") / "model.safetensors", "pt") as untied,
        safe_open(model_factory(family="qwen2", tie=True) / "model.safetensors", "pt") as tied,
    ):
        assert set(untied.keys()) - set(tied.keys()) == {"lm_head.weight"}
        for name in tied.keys():  # noqa: SIM118 - safe_open is not a mapping
            assert torch.equal(untied.get_tensor(name), tied.get_tensor(name)), name


# --- loading in transformers -------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tie", [False, True])
def test_checkpoint_loads_with_exact_keys_and_runs(
    model_factory: ModelFactory, family: str, tie: bool
) -> None:
    path = model_factory(family=family, tie=tie)
    model, info = _load_with_info(path)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert not info["mismatched_keys"] and not info["error_msgs"]
    assert model.config.model_type == family
    assert model.dtype == torch.float32
    with safe_open(path / "model.safetensors", "pt") as weights:
        metadata, names = weights.metadata(), set(weights.keys())
        dtypes = {weights.get_slice(name).get_dtype() for name in names}
    assert metadata == {"format": "pt"}
    assert dtypes == {"F32"}
    assert ("lm_head.weight" in names) is not tie
    if tie:
        assert model.config.tie_word_embeddings
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        logits = model(torch.tensor([[1, 50, 60, 70, 2]])).logits  # [1, 5, vocab]
    assert logits.shape == (1, 5, SIZES["tiny"].vocab_size)
    assert torch.isfinite(logits).all()


def test_config_values(model_factory: ModelFactory) -> None:
    llama = json.loads((model_factory(family="llama") / "config.json").read_text())
    assert llama["rope_parameters"] == {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    qwen2 = json.loads((model_factory(family="qwen2") / "config.json").read_text())
    assert qwen2["rope_parameters"]["rope_theta"] == 1000000.0
    qwen3 = json.loads((model_factory(family="qwen3") / "config.json").read_text())
    # Deliberately heads * head_dim != hidden_size, as in real Qwen3 checkpoints.
    assert qwen3["num_attention_heads"] * qwen3["head_dim"] != qwen3["hidden_size"]
    for config in (llama, qwen2, qwen3):
        assert config["dtype"] == "float32"
        assert config["max_position_embeddings"] == 2048
        assert config["num_key_value_heads"] < config["num_attention_heads"]
    generation = json.loads((model_factory(family="llama") / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [llama["eos_token_id"], llama["pad_token_id"]]


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_counts_fit_the_size(size: str, family: str) -> None:
    spec = SIZES[size]
    token_ids = SpecialTokenIds(bos_token_id=0, eos_token_id=2, pad_token_id=0, stop_token_ids=(2,))
    for tie in (False, True):
        config = build_config(size, family, tie_word_embeddings=tie, token_ids=token_ids)
        assert spec.min_params <= count_parameters(config) <= spec.max_params


def test_bad_arguments_raise_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="size"):
        make_model(tmp_path / "a", size="huge")
    with pytest.raises(ValueError, match="family"):
        make_model(tmp_path / "b", size="tiny", family="gpt2")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="no init rule"):
        init_rule(
            "model.layers.0.self_attn.new_proj.weight",
            (4, 4),
            build_config(
                "tiny", "llama", tie_word_embeddings=False, token_ids=SpecialTokenIds(0, 2, 0, (2,))
            ),
        )


# --- the small size, end to end (slow: ~400 MB written) ----------------------------------------


@pytest.mark.slow
def test_small_checkpoint_loads(tmp_path: Path) -> None:
    path = make_model(tmp_path, size="small", family="llama")
    model, info = _load_with_info(path)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert SIZES["small"].min_params <= model.num_parameters() <= SIZES["small"].max_params
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()

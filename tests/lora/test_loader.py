"""lora/loader.py: PEFT adapters load with PEFT's scaling; every bad adapter is a typed error
naming the problem (SECURITY.md, adapter uploads), read without pickle and without trusting
the safetensors header."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from engine.models.hf_config import load_model_config
from lora.dims import BaseModelDims
from lora.errors import (
    AdapterBaseModelError,
    AdapterConfigError,
    AdapterError,
    AdapterFormatError,
    AdapterNameError,
    AdapterRankError,
    AdapterTargetError,
    AdapterTensorError,
    PickleRejectedError,
    SafetensorsHeaderError,
)
from lora.loader import LoaderLimits, load_adapter
from lora.registry import check_adapter_name
from tests.lora.hostile import copy_adapter, read_tensors, write_raw_safetensors
from tests.lora.peft_builders import AdapterSpec, edit_config, make_peft_adapter

LIMITS = LoaderLimits(max_lora_rank=32, max_header_bytes=1 << 20)
A_NAME = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B_NAME = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


@pytest.fixture(scope="module")
def dims(tiny_model_dir: Path) -> BaseModelDims:
    mc = load_model_config(tiny_model_dir)
    return BaseModelDims(
        mc.num_layers, mc.hidden_size, mc.q_size, mc.kv_size, mc.intermediate_size,
        names=("tiny", str(tiny_model_dir)),
    )  # fmt: skip


@pytest.fixture(scope="module")
def good(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = AdapterSpec(
        "good", r=8, alpha=16, targets=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"down_proj": 16}, alpha_pattern={"v_proj": 4}, seed=3,
    )  # fmt: skip
    return make_peft_adapter(tiny_model_dir, tmp_path_factory.mktemp("good") / "a", spec)


@pytest.fixture
def bad(good: Path, tmp_path: Path) -> Path:
    return copy_adapter(good, tmp_path / "bad")


def test_loads_with_per_module_rank_and_scale_folded_into_b(good: Path, dims: BaseModelDims):
    adapter = load_adapter(str(good), dims, LIMITS)
    raw = read_tensors(good)
    assert adapter.rank == 16
    assert {m for _, m in adapter.modules} == {"q_proj", "v_proj", "down_proj"}
    assert len(adapter.modules) == 3 * dims.num_layers
    for (layer, module), weights in adapter.modules.items():
        parent = "mlp" if module == "down_proj" else "self_attn"
        prefix = f"base_model.model.model.layers.{layer}.{parent}.{module}"
        rank = 16 if module == "down_proj" else 8
        alpha = 4 if module == "v_proj" else 16
        assert weights.rank == rank
        assert torch.equal(weights.lora_a, raw[f"{prefix}.lora_A.weight"])
        expected_b = raw[f"{prefix}.lora_B.weight"] * (alpha / rank)
        torch.testing.assert_close(weights.lora_b, expected_b, rtol=0, atol=0)


def test_rslora_scale_is_alpha_over_sqrt_r(tiny_model_dir, tmp_path, dims):
    spec = AdapterSpec("rs", r=16, alpha=8, use_rslora=True, targets=["o_proj"], seed=1)
    path = make_peft_adapter(tiny_model_dir, tmp_path / "rs", spec)
    adapter = load_adapter(str(path), dims, LIMITS)
    raw = read_tensors(path)
    b = raw["base_model.model.model.layers.2.self_attn.o_proj.lora_B.weight"]
    torch.testing.assert_close(adapter.modules[(2, "o_proj")].lora_b, b * (8 / math.sqrt(16)))


def test_regex_and_all_linear_targets(good: Path, bad: Path, dims: BaseModelDims):
    edit_config(bad, target_modules=r".*\.(q_proj|v_proj|down_proj)")
    assert load_adapter(str(bad), dims, LIMITS).rank == 16
    edit_config(bad, target_modules="all-linear")
    assert load_adapter(str(bad), dims, LIMITS).rank == 16


def _refused(path: Path, dims: BaseModelDims, error: type[AdapterError], words: str) -> None:
    with pytest.raises(error) as info:
        load_adapter(str(path), dims, LIMITS)
    assert info.value.status_code == 400
    assert words in info.value.message, info.value.message


@pytest.mark.parametrize("name", ["adapter_model.bin", "weights.pt", "x.pkl"])
def test_pickle_files_are_refused_unread(bad: Path, dims: BaseModelDims, name: str):
    (bad / name).write_bytes(b"\x80\x04cos\nsystem\n")  # a pickle that would run a command
    _refused(bad, dims, PickleRejectedError, "pickle")


def test_pickle_only_adapter_is_refused(bad: Path, dims: BaseModelDims):
    (bad / "adapter_model.safetensors").rename(bad / "adapter_model.bin")
    _refused(bad, dims, PickleRejectedError, "pickle")


@pytest.mark.parametrize(
    "changes, error, words",
    [
        (
            {"base_model_name_or_path": "meta-llama/Llama-3.1-8B"},
            AdapterBaseModelError,
            "base model",
        ),
        ({"peft_type": "PREFIX_TUNING"}, AdapterConfigError, "peft_type must be LORA"),
        ({"peft_type": None}, AdapterConfigError, "peft_type must be LORA"),
        ({"r": 64}, AdapterRankError, "max_lora_rank 32"),
        ({"r": 0}, AdapterConfigError, "positive integer"),
        ({"r": "8"}, AdapterConfigError, "positive integer"),
        ({"rank_pattern": {"down_proj": 128}}, AdapterRankError, "max_lora_rank"),
        ({"target_modules": ["q_proj", "lm_head"]}, AdapterTargetError, "lm_head"),
        ({"target_modules": ["embed_tokens"]}, AdapterTargetError, "unknown target modules"),
        ({"target_modules": r".*(lm_head|q_proj)"}, AdapterTargetError, "regex"),
        ({"target_modules": "(unclosed"}, AdapterTargetError, "regex"),
        ({"target_modules": None}, AdapterTargetError, "target_modules"),
        ({"modules_to_save": ["lm_head"]}, AdapterConfigError, "modules_to_save"),
        ({"use_dora": True}, AdapterConfigError, "DoRA"),
        ({"bias": "all"}, AdapterConfigError, "bias"),
        ({"lora_alpha": float("nan")}, AdapterConfigError, "lora_alpha"),
        ({"alpha_pattern": {"(": 2}}, AdapterConfigError, "regex"),
    ],
)
def test_bad_configs_name_the_problem(bad, dims, changes, error, words):
    edit_config(bad, **changes)
    _refused(bad, dims, error, words)


def test_config_that_is_not_json_or_missing(bad: Path, dims: BaseModelDims):
    (bad / "adapter_config.json").write_text("{not json")
    _refused(bad, dims, AdapterFormatError, "not valid JSON")
    (bad / "adapter_config.json").unlink()
    _refused(bad, dims, AdapterFormatError, "adapter_config.json")


def test_missing_weights_and_not_a_directory(bad: Path, dims: BaseModelDims):
    (bad / "adapter_model.safetensors").unlink()
    _refused(bad, dims, AdapterFormatError, "adapter_model.safetensors")
    _refused(bad / "nope", dims, AdapterFormatError, "not a readable adapter directory")


def test_adapter_for_another_model_shape_is_refused(bad: Path, dims: BaseModelDims):
    tensors = read_tensors(bad)
    tensors[A_NAME] = torch.zeros(8, 64)  # hidden 64: made for a smaller model
    write_raw_safetensors(bad / "adapter_model.safetensors", tensors)
    _refused(bad, dims, AdapterBaseModelError, "shape [8, 64]")


def test_layer_past_the_base_model_is_refused(bad: Path, dims: BaseModelDims):
    tensors = read_tensors(bad)
    tensors[A_NAME.replace("layers.0", "layers.99")] = tensors.pop(A_NAME)
    tensors[B_NAME.replace("layers.0", "layers.99")] = tensors.pop(B_NAME)
    write_raw_safetensors(bad / "adapter_model.safetensors", tensors)
    _refused(bad, dims, AdapterBaseModelError, "layer 99")


def test_header_shape_that_lies_is_refused(bad: Path, dims: BaseModelDims):
    tensors = read_tensors(bad)
    write_raw_safetensors(
        bad / "adapter_model.safetensors", tensors, shape_override={A_NAME: [8, 512]}
    )
    _refused(bad, dims, SafetensorsHeaderError, "byte size does not match")


def test_offsets_past_the_end_are_refused(bad: Path, dims: BaseModelDims):
    tensors = read_tensors(bad)
    write_raw_safetensors(
        bad / "adapter_model.safetensors", tensors, offset_shift={B_NAME: 1 << 30}
    )
    _refused(bad, dims, SafetensorsHeaderError, "past the end")
    write_raw_safetensors(bad / "adapter_model.safetensors", tensors, truncate_by=16)
    _refused(bad, dims, SafetensorsHeaderError, "past the end")


def test_overlapping_tensors_are_refused(bad: Path, dims: BaseModelDims):
    tensors = {A_NAME: torch.zeros(8, 256), B_NAME: torch.zeros(256, 8)}
    write_raw_safetensors(bad / "adapter_model.safetensors", tensors, offset_shift={B_NAME: -4})
    _refused(bad, dims, SafetensorsHeaderError, "overlaps")


@pytest.mark.parametrize("claimed", [1 << 21, 1 << 40, (1 << 64) - 1])
def test_huge_header_is_refused_before_reading(bad: Path, dims: BaseModelDims, claimed: int):
    write_raw_safetensors(
        bad / "adapter_model.safetensors", read_tensors(bad), header_len_override=claimed
    )
    _refused(bad, dims, SafetensorsHeaderError, "header claims")


def test_garbage_safetensors_is_refused(bad: Path, dims: BaseModelDims):
    (bad / "adapter_model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{{{{{")
    _refused(bad, dims, SafetensorsHeaderError, "not valid JSON")
    (bad / "adapter_model.safetensors").write_bytes(b"\x01\x02")
    _refused(bad, dims, SafetensorsHeaderError, "truncated")


def test_unexpected_unpaired_and_non_finite_tensors(bad: Path, dims: BaseModelDims):
    tensors = read_tensors(bad)
    write_raw_safetensors(
        bad / "adapter_model.safetensors",
        {**tensors, "base_model.model.lm_head.weight": torch.zeros(2, 2)},
    )
    _refused(bad, dims, AdapterTensorError, "unexpected tensor")
    without_b = {k: v for k, v in tensors.items() if k != B_NAME}
    write_raw_safetensors(bad / "adapter_model.safetensors", without_b)
    _refused(bad, dims, AdapterTensorError, "unpaired")
    poisoned = dict(tensors)
    poisoned[B_NAME] = tensors[B_NAME].clone()
    # NaN, inf, and a value that only leaves the float16 range once the scale is folded in
    for value in (float("nan"), float("inf"), 65504.0):
        poisoned[B_NAME][0, 0] = value
        write_raw_safetensors(bad / "adapter_model.safetensors", poisoned)
        _refused(bad, dims, AdapterTensorError, "must be finite and within")


def test_target_outside_config_is_refused(bad: Path, dims: BaseModelDims):
    edit_config(bad, target_modules=["v_proj", "down_proj"])
    _refused(bad, dims, AdapterTensorError, "not in target_modules")


@pytest.mark.parametrize(
    "name", ["", "a/b", "..\\x", "../etc", "tab\there", "nul\x00", "bell\x07", "x" * 10_000,
             " padded", "tiny", ".", "\u202e", 42, None],
)  # fmt: skip
def test_bad_adapter_names(name: object):
    with pytest.raises(AdapterNameError) as info:
        check_adapter_name(name, base_model_name="tiny")
    assert info.value.status_code == 400


@pytest.mark.parametrize("name", ["sql-lora", "tenant_1:support-v2", "a.b@3", "ünïcode"])
def test_good_adapter_names(name: str):
    assert check_adapter_name(name, base_model_name="tiny") == name


def test_to_converts_every_weight_once(good: Path, dims: BaseModelDims):
    adapter = load_adapter(str(good), dims, LoaderLimits(max_lora_rank=64))
    assert adapter.to(torch.float32) is adapter  # already float32: no copy
    half = adapter.to(torch.bfloat16)
    assert half.rank == adapter.rank and half.modules.keys() == adapter.modules.keys()
    for key, w in adapter.modules.items():
        assert half.modules[key].lora_a.dtype == torch.bfloat16
        assert torch.equal(half.modules[key].lora_a, w.lora_a.bfloat16())
        assert torch.equal(half.modules[key].lora_b, w.lora_b.bfloat16())

"""lora/adapter_format: torch-free, the same answer from bytes in memory (uploads) as from a file
(the loader), values widened exactly, the data region tiled as the safetensors library
demands, and the served model's shapes read from config.json in every spelling."""

from __future__ import annotations

import dataclasses
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load as torch_load
from safetensors.torch import save as torch_save

from engine.config import EngineConfig
from engine.models.hf_config import load_model_config
from engine.step.lora_setup import model_dims
from lora.adapter_format import (
    BytesSource,
    FileSource,
    check_adapter,
    parse_checkpoint_shape,
    read_checkpoint_shape,
)
from lora.adapter_format.safetensors_header import read_header
from lora.adapter_format.weights import read_float32
from lora.dims import BaseModelDims
from lora.errors import AdapterError, AdapterTensorError, SafetensorsHeaderError
from lora.loader import LoaderLimits, load_adapter
from tests.lora.hostile import copy_adapter, read_tensors, write_raw_safetensors
from tests.lora.peft_builders import AdapterSpec, edit_config, make_peft_adapter

ROOT = Path(__file__).resolve().parents[2]
A_NAME = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B_NAME = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


@pytest.mark.parametrize(
    "module", ["lora.adapter_format", "tenancy.adapters.validation", "tenancy.crud.tenants"]
)
def test_importing_the_adapter_format_does_not_import_torch(module: str) -> None:
    code = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_half_precision_widens_exactly(tmp_path: Path) -> None:
    special = [0.0, -0.0, 1.0, -2.5, 1e-40, 3e38, 65504.0, float("inf"), float("nan")]
    values = torch.cat([torch.tensor(special), torch.randn(247) * 100]).reshape(16, 16)
    tensors = {
        dtype: values.to(getattr(torch, dtype)) for dtype in ("float32", "float16", "bfloat16")
    }
    blob = torch_save(tensors)
    (tmp_path / "w.safetensors").write_bytes(blob)
    with (tmp_path / "w.safetensors").open("rb") as f:
        sources = [BytesSource(blob), FileSource(f, len(blob))]
        for source in sources:
            entries = read_header(source, max_header_bytes=1 << 20)
            for name, tensor in tensors.items():
                got = torch.from_numpy(read_float32(source, entries[name]))
                assert torch.equal(got.isnan(), tensor.float().isnan())
                assert torch.equal(got.nan_to_num(), tensor.float().nan_to_num()), name


def _safetensors(spans: dict[str, tuple[int, int]], size: int) -> bytes:
    header = {
        name: {"dtype": "F32", "shape": [(end - begin) // 4], "data_offsets": [begin, end]}
        for name, (begin, end) in spans.items()
    }
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + b"\0" * size


@pytest.mark.parametrize(
    "spans, size, words",
    [
        ({"a": (0, 4), "b": (8, 12)}, 12, "gap"),
        ({"a": (0, 4)}, 8, "4 bytes after its last tensor"),
        ({"a": (0, 8), "b": (4, 12)}, 12, "overlaps"),
    ],
)
def test_the_data_region_is_tiled_as_the_safetensors_library_requires(
    spans: dict[str, tuple[int, int]], size: int, words: str
) -> None:
    """Gaps and trailing bytes: PEFT and vLLM read adapters with the safetensors library, which
    refuses them, so an upload holding them would fail on an HTTP-mode vLLM engine."""
    blob = _safetensors(spans, size)
    with pytest.raises(SafetensorsHeaderError, match=words):
        read_header(BytesSource(blob), max_header_bytes=1 << 20)
    with pytest.raises(SafetensorError):
        torch_load(blob)
    tiled = _safetensors({"a": (0, 4), "b": (4, 12)}, 12)
    assert set(read_header(BytesSource(tiled), max_header_bytes=1 << 20)) == {"a", "b"}


@pytest.fixture(scope="module")
def dims(tiny_model_dir: Path) -> BaseModelDims:
    return read_checkpoint_shape(tiny_model_dir).dims(names=("tiny", str(tiny_model_dir)))


@pytest.fixture(scope="module")
def good(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = AdapterSpec(
        "good", r=8, alpha=16, targets=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"down_proj": 16}, alpha_pattern={"v_proj": 4}, seed=3,
    )  # fmt: skip
    return make_peft_adapter(tiny_model_dir, tmp_path_factory.mktemp("fmt") / "a", spec)


def _nan_in_b(d: Path) -> None:
    tensors = read_tensors(d)
    tensors[B_NAME][1, 1] = float("nan")
    write_raw_safetensors(d / "adapter_model.safetensors", tensors)


def _scaled_out_of_range(d: Path) -> None:
    tensors = read_tensors(d)
    tensors[B_NAME][0, 0] = 40000.0  # x 2 once the scale is folded in
    write_raw_safetensors(d / "adapter_model.safetensors", tensors)


def _gap(d: Path) -> None:
    tensors = {A_NAME: torch.zeros(8, 256), B_NAME: torch.zeros(256, 8)}
    write_raw_safetensors(d / "adapter_model.safetensors", tensors, offset_shift={B_NAME: 4})
    with (d / "adapter_model.safetensors").open("ab") as f:
        f.write(b"\0" * 4)  # B now ends at the end of the file, 4 bytes after A ends


CORRUPTIONS: list[tuple[str, Any]] = [
    ("good", lambda d: None),
    ("nan", _nan_in_b),
    ("scaled-range", _scaled_out_of_range),
    ("gap", _gap),
    ("wrong-base", lambda d: edit_config(d, base_model_name_or_path="other/model")),
    ("rank", lambda d: edit_config(d, rank_pattern={"down_proj": 64})),
    ("targets", lambda d: edit_config(d, target_modules=["q_proj"])),
]


@pytest.mark.parametrize("case", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_upload_checks_and_the_loader_give_the_same_answer(
    good: Path, dims: BaseModelDims, tmp_path: Path, case: tuple[str, Any]
) -> None:
    """One implementation: bytes in memory (an upload) and the directory (the loader) are
    accepted or refused alike, with the same error and message."""
    adapter = copy_adapter(good, tmp_path / "a")
    case[1](adapter)
    limits = LoaderLimits(max_lora_rank=32, max_header_bytes=1 << 20)
    outcomes = []
    for run in (
        lambda: (
            check_adapter(
                (adapter / "adapter_config.json").read_bytes(),
                BytesSource((adapter / "adapter_model.safetensors").read_bytes()),
                dims,
                max_rank=limits.max_lora_rank,
                max_header_bytes=limits.max_header_bytes,
            ).rank
        ),
        lambda: load_adapter(str(adapter), dims, limits).rank,
    ):
        try:
            outcomes.append(run())
        except AdapterError as exc:
            outcomes.append((type(exc), exc.message))
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] == 16) == (case[0] == "good"), outcomes[0]


def test_a_value_out_of_range_names_the_tensor(good: Path, dims: BaseModelDims, tmp_path: Path):
    adapter = copy_adapter(good, tmp_path / "a")
    _scaled_out_of_range(adapter)
    with pytest.raises(AdapterTensorError) as info:
        load_adapter(str(adapter), dims, LoaderLimits(max_lora_rank=32))
    assert repr(B_NAME) in info.value.message and "times its scale 2" in info.value.message


TINY_4X = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 1024,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
    "torch_dtype": "float32",
}  # fmt: skip


@pytest.mark.parametrize(
    "raw, expected",
    [
        (TINY_4X, (8, 256, 1024, 8, 4, 32)),
        ({**TINY_4X, "head_dim": None}, (8, 256, 1024, 8, 4, 32)),
        ({**TINY_4X, "head_dim": 64}, (8, 256, 1024, 8, 4, 64)),
        ({k: v for k, v in TINY_4X.items() if k != "num_key_value_heads"}, (8, 256, 1024, 8, 8, 32)),
        (
            {"architectures": ["Mistral3ForConditionalGeneration"], "dtype": "bfloat16",
             "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24},
             "text_config": {**TINY_4X, "head_dim": 128, "num_hidden_layers": 40}},
            (40, 256, 1024, 8, 4, 128),
        ),
    ],
    ids=["4.x", "head_dim-null", "head_dim", "no-gqa", "5.x-text_config"],
)  # fmt: skip
def test_checkpoint_shape_spellings(raw: dict[str, Any], expected: tuple[int, ...]) -> None:
    shape = parse_checkpoint_shape(raw)
    assert (
        shape.num_layers, shape.hidden_size, shape.intermediate_size,
        shape.num_heads, shape.num_kv_heads, shape.head_dim,
    ) == expected  # fmt: skip


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "intermediate_size"])
@pytest.mark.parametrize("value", [None, 0, "256", True])
def test_checkpoint_shape_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        parse_checkpoint_shape({**TINY_4X, field: value})


def test_checkpoint_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"config\.json cannot be read"):
        read_checkpoint_shape(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(ValueError, match="not a JSON object"):
        read_checkpoint_shape(tmp_path)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_checkpoint_shape_matches_what_the_engine_serves(model_factory: Any, family: str) -> None:
    model_dir = model_factory(family=family)
    mc = load_model_config(model_dir)
    served = model_dims(mc, EngineConfig(model=str(model_dir)))
    assert read_checkpoint_shape(model_dir).dims() == dataclasses.replace(served, names=())

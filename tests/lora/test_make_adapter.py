"""`loragate make-adapter` (lora/make_adapter.py): the adapter it writes loads in PEFT with every
tensor it holds, loads through the engine's loader with PEFT's scale, and passes upload
validation within the rank limit (and is refused above it, naming `r`)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gateway.cli import main
from lora.adapter_format import CONFIG_FILE, LORA_MODULES, WEIGHTS_FILE, read_checkpoint_shape
from lora.loader import LoaderLimits, load_adapter
from lora.make_adapter import AdapterRecipe, make_adapter
from tenancy.adapters.base_model import base_model_spec
from tenancy.adapters.errors import AdapterRejected
from tenancy.adapters.validation import FormatChecksValidator
from tenancy.settings import AdapterLimits, TenancySettings


def _made(tiny_model_dir: Path, out: Path, *extra: str) -> Path:
    code = main(["make-adapter", str(tiny_model_dir), str(out), "--rank", "4", *extra])
    assert code == 0
    return out


def test_the_command_writes_a_seeded_peft_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    one = _made(tiny_model_dir, tmp_path / "one", "--seed", "7", "--alpha", "3")
    again = _made(tiny_model_dir, tmp_path / "again", "--seed", "7", "--alpha", "3")
    other = _made(tiny_model_dir, tmp_path / "other", "--seed", "8", "--alpha", "3")
    assert sorted(p.name for p in one.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    assert (one / WEIGHTS_FILE).read_bytes() == (again / WEIGHTS_FILE).read_bytes()
    assert (one / WEIGHTS_FILE).read_bytes() != (other / WEIGHTS_FILE).read_bytes()
    config = json.loads((one / CONFIG_FILE).read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 3, "LORA")
    assert config["target_modules"] == list(LORA_MODULES)
    assert config["base_model_name_or_path"] == tiny_model_dir.resolve().name
    some = _made(tiny_model_dir, tmp_path / "some", "--target-modules", "v_proj", "q_proj")
    assert json.loads((some / CONFIG_FILE).read_text())["target_modules"] == ["q_proj", "v_proj"]
    layers = read_checkpoint_shape(tiny_model_dir).num_layers
    assert len(load_file(str(some / WEIGHTS_FILE))) == layers * 2 * 2


def test_bad_options_are_refused_by_name(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="rank must be a positive integer"):
        _made(tiny_model_dir, tmp_path / "x", "--rank", "0")
    with pytest.raises(SystemExit, match=r"config\.json"):
        main(["make-adapter", str(tmp_path), str(tmp_path / "y"), "--rank", "4"])


def test_peft_loads_every_tensor(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = make_adapter(tiny_model_dir, tmp_path / "a", AdapterRecipe(rank=4, seed=1))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 13]])
    before = base(ids).logits
    model = PeftModel.from_pretrained(base, str(out)).eval()
    loaded = {n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n}
    saved = load_file(str(out / WEIGHTS_FILE))
    assert sorted(loaded) == sorted(saved)  # nothing missing, nothing left over
    for name, tensor in saved.items():
        torch.testing.assert_close(loaded[name].detach(), tensor)
    assert not torch.allclose(model(ids).logits, before)  # the random B is not PEFT's zero


def test_the_engine_loader_takes_it_with_peft_scale(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = make_adapter(tiny_model_dir, tmp_path / "a", AdapterRecipe(rank=8, alpha=4, seed=2))
    dims = read_checkpoint_shape(tiny_model_dir).dims((tiny_model_dir.resolve().name,))
    adapter = load_adapter(str(out), dims, LoaderLimits(max_lora_rank=8))
    assert adapter.rank == 8 and len(adapter.modules) == dims.num_layers * len(LORA_MODULES)
    saved = load_file(str(out / WEIGHTS_FILE))
    b = saved["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    torch.testing.assert_close(adapter.modules[(0, "q_proj")].lora_b, b * (4 / 8))


def test_upload_validation_accepts_it_within_the_rank_limit(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = TenancySettings(
        key_pepper=secrets.token_urlsafe(32), salt_secret=secrets.token_urlsafe(32),
        adapter_limits=AdapterLimits(max_rank=16),
        base_model=base_model_spec(tiny_model_dir, tiny_model_dir.resolve().name),
    )  # type: ignore[arg-type]  # fmt: skip
    validator = FormatChecksValidator(settings)
    for rank in (1, 16):
        files = make_adapter(tiny_model_dir, tmp_path / f"r{rank}", AdapterRecipe(rank=rank))
        spec = validator.validate({p.name: p.read_bytes() for p in files.iterdir()}).spec
        assert spec.rank == rank and spec.target_modules == LORA_MODULES
    wide = make_adapter(tiny_model_dir, tmp_path / "r32", AdapterRecipe(rank=32))
    with pytest.raises(AdapterRejected, match="above this server's max_lora_rank 16") as refused:
        validator.validate({p.name: p.read_bytes() for p in wide.iterdir()})
    assert refused.value.param == "r"

"""Uploads are checked against the served checkpoint, and what they accept the engine serves:
an adapter with rank_pattern / alpha_pattern, uploaded through the admin API, gives PEFT's
greedy tokens on the real engine; the demo's adapter helper, given the checkpoint, makes
adapters both the upload checks and the engine's loader accept."""

from __future__ import annotations

import dataclasses
import io
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from admin_harness import admin_harness
from tenancy_factories import SecretRegistry

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.models.hf_config import load_model_config
from engine.step.lora_setup import model_dims
from gateway.demo.adapters import write_demo_adapter
from lora.adapter_format import read_bundle
from lora.loader import LoaderLimits, load_adapter
from tenancy.adapters.base_model import base_model_spec
from tenancy.adapters.validation import FormatChecksValidator
from tenancy.settings import AdapterLimits, TenancySettings
from tests.engine.engine_helpers import (
    capture_first_logits,
    random_prompts,
    request,
    run_to_completion,
)
from tests.lora.peft_builders import AdapterSpec, load_base, make_peft_adapter

SPEC = AdapterSpec(
    "patterned",
    r=8,
    alpha=16,
    rank_pattern={"down_proj": 16, "model.layers.1.self_attn.o_proj": 4},
    alpha_pattern={"k_proj": 32},
    seed=21,
    b_std=0.05,
)
LENGTHS = [3, 17, 40]
MAX_TOKENS = 8


def _settings(make_settings: Callable[..., TenancySettings], model_dir: Path) -> TenancySettings:
    # What GatewaySettings derives for the served checkpoint (served under its directory's
    # name, which is also the tail of the base_model_name_or_path PEFT writes).
    return make_settings(
        base_model=base_model_spec(model_dir, model_dir.name),
        adapter_limits=AdapterLimits(max_rank=16),
    )


async def test_rank_pattern_upload_is_served_with_peft_parity(
    tiny_model_dir: Path,
    tmp_path: Path,
    make_settings: Callable[..., TenancySettings],
    secret_registry: SecretRegistry,
) -> None:
    made = make_peft_adapter(tiny_model_dir, tmp_path / "patterned", SPEC)
    config = json.loads((made / "adapter_config.json").read_text())
    assert config["rank_pattern"] == SPEC.rank_pattern
    files = [("files", (p.name, p.read_bytes())) for p in sorted(made.iterdir())]
    settings = _settings(make_settings, tiny_model_dir)
    async with admin_harness(settings) as h:
        secret_registry.add(h.admin_key)
        tenant = (await h.call("POST", "/tenants", json={"name": "owner"})).json()["id"]
        r = await h.call(
            "POST", f"/tenants/{tenant}/adapters", data={"name": "patterned"}, files=files
        )
        assert r.status_code == 201, r.text
        assert r.json()["rank"] == 16
        # What an engine unpacks: the bundle the store serves for this version.
        bundle = await h.runtime.adapters.open_bundle(h.runtime.sessionmaker, r.json()["id"])
        assert bundle is not None and bundle.sha256 == r.json()["sha256"]
        data = b"".join([chunk async for chunk in bundle.chunks])
        stored = tmp_path / "stored"
        stored.mkdir()
        for name, content in read_bundle(io.BytesIO(data), max_bytes=len(data)).items():
            (stored / name).write_bytes(content)

    prompts = random_prompts(seed=31, lengths=LENGTHS, vocab=2600)
    tokens, logits = _engine_run(tiny_model_dir, stored, prompts)
    ref_tokens, ref_logits, base_tokens = _peft_run(tiny_model_dir, stored, prompts)
    assert ref_tokens != base_tokens  # the adapter changes what the model writes
    for i in range(len(prompts)):
        assert tokens[i] == ref_tokens[i], f"prompt {i}"
        diff = (logits[i].cpu() - ref_logits[i]).abs().max().item()
        assert diff < 1e-4, f"prompt {i}: first-step logits differ by {diff}"


def _engine_run(
    model_dir: Path, adapter_dir: Path, prompts: list[list[int]]
) -> tuple[list[list[int]], list[torch.Tensor]]:
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",
            num_kv_blocks=64,
            max_num_seqs=len(prompts),
            max_lora_rank=16,
            max_loras=1,
            max_cpu_loras=1,
        )
    )
    assert engine.lora is not None
    engine.lora.add("patterned", str(adapter_dir))
    first_logits = capture_first_logits(engine)
    for i, prompt in enumerate(prompts):
        base = request(f"r{i}", prompt, max_tokens=MAX_TOKENS)
        engine.add_request(dataclasses.replace(base, adapter_name="patterned"))
    collected = run_to_completion(engine)
    ids = [f"r{i}" for i in range(len(prompts))]
    return [collected.tokens_of(rid) for rid in ids], [first_logits[rid] for rid in ids]


def _peft_run(
    model_dir: Path, adapter_dir: Path, prompts: list[list[int]]
) -> tuple[list[list[int]], list[torch.Tensor], list[list[int]]]:
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model: Any = PeftModel.from_pretrained(load_base(model_dir), str(adapter_dir)).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    tokens, logits, base_tokens = [], [], []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = _generate(model, ids)
            tokens.append(out.sequences[0, len(prompt) :].tolist())
            logits.append(out.scores[0][0].float())
            with model.disable_adapter():
                base_tokens.append(_generate(model, ids).sequences[0, len(prompt) :].tolist())
    return tokens, logits, base_tokens


def _generate(model: Any, ids: torch.Tensor) -> Any:
    return model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=MAX_TOKENS,
        output_scores=True,
        return_dict_in_generate=True,
    )


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_demo_helper_makes_adapters_the_served_checkpoint_accepts(
    model_factory: Callable[..., Path],
    tmp_path: Path,
    make_settings: Callable[..., TenancySettings],
    family: str,
) -> None:
    """The helper used to take hand-configured shapes (64 wide by default) while the demo serves
    a 256-wide checkpoint; given the checkpoint, its adapters pass the upload checks and the
    engine's loader. Qwen3 states a head_dim that is not hidden_size / num_heads."""
    model_dir = model_factory(family=family)
    out = write_demo_adapter(tmp_path / "demo", model_dir, seed=1)
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    validated = FormatChecksValidator(_settings(make_settings, model_dir)).validate(files)
    assert validated.spec.rank == 8 and len(validated.spec.target_modules) == 7
    mc = load_model_config(model_dir)
    config = EngineConfig(model=str(model_dir), served_model_name=model_dir.name)
    loaded = load_adapter(str(out), model_dims(mc, config), LoaderLimits(max_lora_rank=8))
    assert len(loaded.modules) == 7 * mc.num_layers

"""The loader on checkpoints that transformers itself writes: sharded safetensors, Mistral,
Llama 2 style (default RoPE, o/qkv biases), the 4.x and 5.x config spellings, and dtypes."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.models.hf_config import parse_model_config
from tests.engine.engine_helpers import (
    capture_first_logits,
    random_prompts,
    request,
    run_to_completion,
)

COMMON = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def save_random(config, path, **save_kwargs):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Sharp logits and non-uniform attention make greedy parity a strong check.
            if "lm_head" in name:
                param.mul_(50)
            if "q_proj" in name or "k_proj" in name:
                param.mul_(5)
            if "bias" in name:
                param.normal_(0, 0.05)
    model.save_pretrained(path, **save_kwargs)
    return model.eval()


def greedy_parity(model_dir, hf, dtype="float32"):  # type: ignore[no-untyped-def]
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir), dtype=dtype, num_kv_blocks=128, max_num_batched_tokens=24
        )
    )
    prompts = random_prompts(seed=3, lengths=[1, 9, 40], vocab=512)
    first = capture_first_logits(engine)
    for i, prompt in enumerate(prompts):
        engine.add_request(request(f"p{i}", prompt, max_tokens=10))
    collected = run_to_completion(engine)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            ref = hf.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10
            )
            logits = hf(ids).logits[0, -1].float()
        assert collected.tokens_of(f"p{i}") == ref[0, len(prompt) :].tolist()
        assert (first[f"p{i}"] - logits).abs().max().item() < 1e-4
    return engine


def test_sharded_checkpoint_loads_with_parity(tmp_path):
    hf = save_random(LlamaConfig(**COMMON), tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "the checkpoint should be sharded"
    greedy_parity(tmp_path, hf)


def test_mistral_checkpoint_with_parity(tmp_path):
    hf = save_random(MistralConfig(**COMMON, sliding_window=None), tmp_path)
    engine = greedy_parity(tmp_path, hf)
    assert engine.model_config.family == "mistral"


def test_llama2_style_biases_and_default_rope_with_parity(tmp_path):
    config = LlamaConfig(**COMMON, attention_bias=True, rope_theta=10000.0)
    hf = save_random(config, tmp_path)
    engine = greedy_parity(tmp_path, hf)
    assert engine.model_config.qkv_bias and engine.model_config.o_bias
    assert engine.model_config.rope.rope_type == "default"


def test_transformers_4x_and_5x_config_spellings_parse_the_same():
    v4 = {
        "architectures": ["LlamaForCausalLM"],
        **COMMON,
        "torch_dtype": "bfloat16",
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    }  # fmt: skip
    v5 = {
        "architectures": ["LlamaForCausalLM"],
        **COMMON,
        "dtype": "bfloat16",
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 64},
    }  # fmt: skip
    assert parse_model_config(v4) == parse_model_config(v5)
    parsed = parse_model_config(v5)
    assert parsed.torch_dtype == "bfloat16" and parsed.rope.theta == 500000.0
    assert parsed.rope.rope_type == "llama3" and parsed.rope.original_max_position_embeddings == 64


def test_unsupported_architecture_and_rope_are_named():
    with pytest.raises(ValueError, match="architectures"):
        parse_model_config({"architectures": ["GPT2LMHeadModel"], **COMMON})
    with pytest.raises(ValueError, match="rope_type"):
        parse_model_config(
            {"architectures": ["LlamaForCausalLM"], **COMMON, "rope_scaling": {"rope_type": "yarn"}}
        )


def test_pickle_only_directory_is_refused(tmp_path):
    save_random(LlamaConfig(**COMMON), tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pickle"):
        LLMEngine(EngineConfig(model=str(tmp_path), num_kv_blocks=16))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_in_that_dtype_and_tracks_transformers(tiny_model_dir, dtype):
    prompt = list(range(5, 40))
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype=dtype, num_kv_blocks=64))
    assert engine.runner.kv_caches[0][0].dtype == getattr(torch, dtype)
    assert next(engine.runner.model.parameters()).dtype == getattr(torch, dtype)
    captured = capture_first_logits(engine)
    engine.add_request(request("p", prompt, max_tokens=2))
    run_to_completion(engine)
    ours = captured["p"]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=getattr(torch, dtype)).eval()
    hf32 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0, -1].float()
        ref32 = hf32(torch.tensor([prompt])).logits[0, -1].float()
    # Both implementations round at different points; each differs from fp32 by rounding noise,
    # and ours is no further from transformers-in-the-same-dtype than that noise.
    noise = (ref - ref32).abs().max().item()
    assert noise > 0
    assert (ours - ref).abs().max().item() <= 3 * noise
    assert (ours - ref32).abs().max().item() <= 3 * noise

"""Deterministic Hugging Face checkpoints built offline: `make_model(out_dir, size=..., family=...)`.

The same call always writes byte-identical files (on the same torch, tokenizers and
transformers versions): a BPE tokenizer trained on the committed corpus, a transformers
config, and seeded random float32 weights tuned to be a sharp test oracle (see weights.py).
"""

from __future__ import annotations

from pathlib import Path

from engine.make_model.config import (
    FAMILIES,
    MAX_POSITION_EMBEDDINGS,
    SizeSpec,
    SpecialTokenIds,
    build_config,
    build_generation_config,
    size_spec,
)
from engine.make_model.tokenizer import (
    ENDOFTEXT,
    IM_END,
    special_token_id,
    train_tokenizer,
    write_tokenizer,
)
from engine.make_model.weights import count_parameters, write_weights

__all__ = ["FAMILIES", "SizeSpec", "count_parameters", "make_model", "size_spec"]


def make_model(
    out_dir: Path, *, size: str, family: str = "llama", tie_word_embeddings: bool = False
) -> Path:
    """Write a `size` ("tiny" or "small") `family` checkpoint into out_dir and return out_dir.

    Files: config.json, generation_config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json (with a ChatML chat template) and special_tokens_map.json.
    Existing files of those names are overwritten; other files are left alone.
    """
    spec = size_spec(size)
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(spec.vocab_size)
    endoftext_id = special_token_id(tokenizer, ENDOFTEXT)
    im_end_id = special_token_id(tokenizer, IM_END)
    # Qwen's convention: no BOS is prepended, and <|endoftext|> doubles as BOS id and padding.
    token_ids = SpecialTokenIds(
        bos_token_id=endoftext_id,
        eos_token_id=im_end_id,
        pad_token_id=endoftext_id,
        stop_token_ids=(im_end_id, endoftext_id),
    )
    config = build_config(
        size, family, tie_word_embeddings=tie_word_embeddings, token_ids=token_ids
    )

    write_tokenizer(tokenizer, out_dir, model_max_length=MAX_POSITION_EMBEDDINGS)
    config.save_pretrained(out_dir)
    build_generation_config(token_ids).save_pretrained(out_dir)
    write_weights(config, out_dir / "model.safetensors", num_tokens=tokenizer.get_vocab_size())
    return out_dir

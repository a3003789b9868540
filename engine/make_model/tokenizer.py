"""A byte-level BPE tokenizer trained on the committed corpus, saved in Hugging Face layout."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# The trainer gives special tokens the first ids in this order: endoftext 0, im_start 1, im_end 2.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# ChatML. A message's content is a string; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# Qwen2's split rule (single digits, letters with one leading non-letter). transformers 5 loads a
# qwen2 checkpoint through Qwen2Tokenizer, which rebuilds the pipeline with this regex (plus NFC)
# whatever tokenizer.json says; using it everywhere keeps all families' token ids identical.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Pairs seen once are noise in a corpus this small; with this floor the trainer stops well short
# of either size's target, so tiny and small share one tokenizer and both have padded rows.
_MIN_PAIR_FREQUENCY = 2


def read_corpus() -> list[str]:
    """The committed training text, one paragraph or code line per item."""
    text = resources.files(__package__).joinpath("corpus.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def train_tokenizer(target_vocab_size: int) -> Tokenizer:
    """Train byte-level BPE with at most `target_vocab_size` entries, special tokens included.

    Every byte is in the initial alphabet and no normalizer runs, so any UTF-8 string
    round-trips through encode and decode (through transformers 5's Qwen2Tokenizer, which adds
    NFC, any NFC string does). Training gives the same merges in every run: checked across
    processes with different hash seeds and with TOKENIZERS_PARALLELISM on and off, and the
    tests train twice in one process.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=target_vocab_size,
        min_frequency=_MIN_PAIR_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(read_corpus(), trainer=trainer)
    return tokenizer


def special_token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"special token {token!r} is missing from the trained vocabulary")
    return int(token_id)


def tokenizer_config(tokenizer: Tokenizer, *, model_max_length: int) -> dict[str, Any]:
    """tokenizer_config.json: readable by transformers 4.x and 5.x alike.

    `PreTrainedTokenizerFast` makes transformers load tokenizer.json as is; a model-specific
    class (LlamaTokenizer, Qwen2Tokenizer) would rebuild the pre-tokenizer to its own recipe.
    The chat template stays inline rather than in chat_template.jinja, which 4.x never reads.
    """
    added_tokens_decoder = {
        str(special_token_id(tokenizer, token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def special_tokens_map() -> dict[str, Any]:
    return {
        "additional_special_tokens": [IM_START, IM_END],
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
    }


def write_tokenizer(tokenizer: Tokenizer, out_dir: Path, *, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into out_dir."""
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)
    _write_json(
        out_dir / "tokenizer_config.json",
        tokenizer_config(tokenizer, model_max_length=model_max_length),
    )
    _write_json(out_dir / "special_tokens_map.json", special_tokens_map())


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    # Sorted keys and a trailing newline: the bytes depend only on the content.
    path.write_text(
        json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )

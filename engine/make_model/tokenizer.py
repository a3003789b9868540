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

# ChatML, with tools as Qwen2.5 (Hermes) writes them. Without tools, tool calls or tool messages
# it renders exactly what plain ChatML did: one turn per message, its content a string.
# With `tools`, the system turn (the first system message's content, then a blank line) lists
# each tool as given (`tojson`, so OpenAI's {"type": "function", ...} and a bare function both
# work) and shows the call format; a call's `arguments` string is written as is, a mapping as
# JSON. Consecutive tool messages share one user turn, each in <tool_response> tags. The
# generation prompt opens the assistant turn. The tool-call layout here is what
# gateway/openai/tool_calls.py reads and gateway/openai/tool_grammar.py forces.
# The two texts below are the bodies of Jinja string literals (hence the escaped newlines).
_TOOLS_INTRO = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
_TOOLS_OUTRO = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>'
)
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}"
    "{%- endif %}"
    "{{- '" + _TOOLS_INTRO + "' }}"
    "{%- for tool in tools %}"
    "{{- '\\n' + (tool | tojson) }}"
    "{%- endfor %}"
    "{{- '" + _TOOLS_OUTRO + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{#- already written into the system turn above #}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}"
    "{{- '\\n' + message['content'] }}"
    "{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set call = call['function'] if call['function'] is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": ' + (call['name'] | tojson) + ', \"arguments\": ' }}"
    "{%- if call['arguments'] is string %}"
    "{{- call['arguments'] }}"
    "{%- else %}"
    "{{- call['arguments'] | tojson }}"
    "{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
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

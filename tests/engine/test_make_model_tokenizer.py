"""make_model's tokenizer and chat template: the tokenizer round-trips any UTF-8 and loads the same
through AutoTokenizer for every family; the template renders ChatML, and Qwen2.5's tool format
when tools are given (byte-identical to plain ChatML when they are not).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from engine.make_model.config import FAMILIES, SIZES
from engine.make_model.tokenizer import read_corpus
from tests.conftest import ModelFactory

# NFC text only: transformers 5 loads qwen2 through Qwen2Tokenizer, which normalizes to NFC.
SAMPLE_TEXTS = [
    "The scheduler frees 16 blocks.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "café naïve Zürich Straße mañana φως мир 山 水 🙂🚲",
    '{"role": "user", "content": "x = a[i] + 3.14e-2"}',
    "<|im_start|> written by a user is still a special token",
]


def test_tokenizer_json_round_trips_any_utf8(model_factory: ModelFactory) -> None:
    tokenizer = Tokenizer.from_file(str(model_factory(family="llama") / "tokenizer.json"))
    decomposed = unicodedata.normalize("NFD", "César à Zürich")
    for text in [*SAMPLE_TEXTS, decomposed, "\x00\x7f\u200b\ufeff"]:
        ids = tokenizer.encode(text).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_tokenizer_matches_tokenizer_json(model_factory: ModelFactory, family: str) -> None:
    path = model_factory(family=family)
    tokenizer = AutoTokenizer.from_pretrained(path)
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert len(tokenizer) <= SIZES["tiny"].vocab_size
    for text in SAMPLE_TEXTS:
        ids = tokenizer.encode(text)
        assert ids == raw.encode(text).ids
        assert tokenizer.decode(ids) == text
    # Merges actually compress prose; a byte-level fallback alone would give ~1 token per byte.
    prose = " ".join(read_corpus()[:20])
    assert len(tokenizer.encode(prose)) < len(prose.encode()) / 3


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_template_renders_chatml(model_factory: ModelFactory, family: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_factory(family=family))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Où est le café?"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nOù est le café?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    encoded: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    # transformers 5 returns a BatchEncoding here, 4.x a plain list of ids.
    ids: list[int] = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    assert ids == tokenizer.encode(text)
    im_start = tokenizer.vocab["<|im_start|>"]
    im_end = tokenizer.vocab["<|im_end|>"]
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None


# The template before tools were added, verbatim: without tools it must render the same bytes.
PLAIN_CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city, in °C",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
BARE_TOOL = {"name": "noop", "parameters": {"type": "object", "properties": {}}}


def test_chat_template_without_tools_is_plain_chatml(model_factory: ModelFactory) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_factory(family="llama"))
    conversations = [
        [{"role": "user", "content": "Hi"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Où est le café? <tool_call> {}"},
            {"role": "assistant", "content": "Ici.\n"},
            {"role": "user", "content": ""},
        ],
        [{"role": "assistant", "content": "x", "tool_calls": []}, {"role": "user", "content": "y"}],
    ]
    for messages in conversations:
        for prompt in (False, True):
            for tools in ({}, {"tools": None}, {"tools": []}):
                args = {"tokenize": False, "add_generation_prompt": prompt, **tools}
                now = tokenizer.apply_chat_template(messages, **args)
                before = tokenizer.apply_chat_template(
                    messages, chat_template=PLAIN_CHATML_TEMPLATE, **args
                )
                assert now == before


def _tools_listing(tools: list[dict[str, Any]]) -> str:
    """The system turn's tools section as Qwen2.5 writes it, up to the end of the turn."""
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        + "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    )


def test_chat_template_lists_tools_in_the_system_turn(model_factory: ModelFactory) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_factory(family="llama"))
    tools = [WEATHER_TOOL, BARE_TOOL]
    listing = _tools_listing(tools)
    user = [{"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(
        user, tools=tools, tokenize=False, add_generation_prompt=True
    )
    tail = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert text == "<|im_start|>system\n" + listing + tail
    system = [{"role": "system", "content": "Be brief."}, *user]
    text = tokenizer.apply_chat_template(
        system, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>system\nBe brief.\n\n" + listing + tail
    assert '"description": "Weather in a city, in °C"' in text  # tojson keeps non-ASCII


def test_chat_template_renders_a_tool_round_trip(model_factory: ModelFactory) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_factory(family="llama"))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich and Bern?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [  # OpenAI's shape, arguments a JSON string written as is
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Zürich"}'},
                },
                {"name": "get_weather", "arguments": {"city": "Bern", "days": 2}},  # bare
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "18"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [{"name": "noop", "arguments": {}}],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": ""},
        {"role": "user", "content": "Thanks"},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=[WEATHER_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nBe brief.\n\n"
        + _tools_listing([WEATHER_TOOL])
        + "<|im_start|>user\nWeather in Zürich and Bern?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Zürich"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bern", "days": 2}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        '<tool_response>\n{"celsius": 21}\n</tool_response>\n'
        "<tool_response>\n18\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nChecking.\n"
        '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n"
        "<|im_start|>assistant\n"
    )

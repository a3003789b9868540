"""make_model: deterministic, loadable checkpoints that are sharp enough to serve as test oracles."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from engine.make_model import make_model
from engine.make_model.config import FAMILIES, SIZES, SpecialTokenIds, build_config
from engine.make_model.tokenizer import read_corpus, train_tokenizer
from engine.make_model.weights import count_parameters, init_rule

CHECKPOINT_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}
# NFC text only: transformers 5 loads qwen2 through Qwen2Tokenizer, which normalizes to NFC.
SAMPLE_TEXTS = [
    "The scheduler frees 16 blocks.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "café naïve Zürich Straße mañana φως мир 山 水 🙂🚲",
    '{"role": "user", "content": "x = a[i] + 3.14e-2"}',
    "<|im_start|> written by a user is still a special token",
]

Checkpoint = Callable[..., Path]
ModelGetter = Callable[[str], PreTrainedModel]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """Build tiny checkpoints on demand, once per (family, tie) for the whole module."""
    built: dict[tuple[str, bool], Path] = {}

    def get(family: str, *, tie: bool = False) -> Path:
        key = (family, tie)
        if key not in built:
            out = tmp_path_factory.mktemp(f"tiny-{family}-{'tied' if tie else 'untied'}")
            built[key] = make_model(out, size="tiny", family=family, tie_word_embeddings=tie)
        return built[key]

    return get


@pytest.fixture(scope="module")
def models(checkpoint: Checkpoint) -> ModelGetter:
    loaded: dict[str, PreTrainedModel] = {}

    def get(family: str) -> PreTrainedModel:
        if family not in loaded:
            model = AutoModelForCausalLM.from_pretrained(
                checkpoint(family), attn_implementation="eager"
            )
            loaded[family] = model.eval()
        return loaded[family]

    return get


def _corpus_ids(path: Path, num_tokens: int) -> torch.Tensor:
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = "\n".join(read_corpus()[10:60])
    ids = tokenizer.encode(text)[:num_tokens]
    assert len(ids) == num_tokens
    return torch.tensor([ids])  # [1, num_tokens]


def _load_with_info(path: Path) -> tuple[PreTrainedModel, dict[str, Any]]:
    loaded = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    return cast(tuple[PreTrainedModel, dict[str, Any]], loaded)


def _file_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


# --- determinism -------------------------------------------------------------------------------


def test_same_call_writes_identical_bytes(tmp_path: Path, checkpoint: Checkpoint) -> None:
    again = make_model(tmp_path / "again", size="tiny", family="llama")
    first, second = _file_bytes(checkpoint("llama")), _file_bytes(again)
    assert set(first) == CHECKPOINT_FILES
    assert first.keys() == second.keys()
    for name in first:
        assert first[name] == second[name], name


def test_tokenizer_training_is_deterministic() -> None:
    assert train_tokenizer(4096).to_str() == train_tokenizer(4096).to_str()


def test_tied_and_untied_share_every_common_tensor(checkpoint: Checkpoint) -> None:
    # Per-name seeds: dropping lm_head must not shift any other tensor's values.
    with (
        safe_open(checkpoint("qwen2") / "model.safetensors", "pt") as untied,
        safe_open(checkpoint("qwen2", tie=True) / "model.safetensors", "pt") as tied,
    ):
        assert set(untied.keys()) - set(tied.keys()) == {"lm_head.weight"}
        for name in tied.keys():  # noqa: SIM118 - safe_open is not a mapping
            assert torch.equal(untied.get_tensor(name), tied.get_tensor(name)), name


# --- loading in transformers -------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tie", [False, True])
def test_checkpoint_loads_with_exact_keys_and_runs(
    checkpoint: Checkpoint, family: str, tie: bool
) -> None:
    path = checkpoint(family, tie=tie)
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


def test_config_values(checkpoint: Checkpoint) -> None:
    llama = json.loads((checkpoint("llama") / "config.json").read_text())
    assert llama["rope_parameters"] == {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    qwen2 = json.loads((checkpoint("qwen2") / "config.json").read_text())
    assert qwen2["rope_parameters"]["rope_theta"] == 1000000.0
    qwen3 = json.loads((checkpoint("qwen3") / "config.json").read_text())
    # Deliberately heads * head_dim != hidden_size, as in real Qwen3 checkpoints.
    assert qwen3["num_attention_heads"] * qwen3["head_dim"] != qwen3["hidden_size"]
    for config in (llama, qwen2, qwen3):
        assert config["dtype"] == "float32"
        assert config["max_position_embeddings"] == 2048
        assert config["num_key_value_heads"] < config["num_attention_heads"]
    generation = json.loads((checkpoint("llama") / "generation_config.json").read_text())
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


# --- tokenizer and chat template ---------------------------------------------------------------


def test_tokenizer_json_round_trips_any_utf8(checkpoint: Checkpoint) -> None:
    tokenizer = Tokenizer.from_file(str(checkpoint("llama") / "tokenizer.json"))
    decomposed = unicodedata.normalize("NFD", "César à Zürich")
    for text in [*SAMPLE_TEXTS, decomposed, "\x00\x7f\u200b\ufeff"]:
        ids = tokenizer.encode(text).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_tokenizer_matches_tokenizer_json(checkpoint: Checkpoint, family: str) -> None:
    path = checkpoint(family)
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
def test_chat_template_renders_chatml(checkpoint: Checkpoint, family: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint(family))
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


def test_chat_template_without_tools_is_plain_chatml(checkpoint: Checkpoint) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint("llama"))
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


def test_chat_template_lists_tools_in_the_system_turn(checkpoint: Checkpoint) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint("llama"))
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


def test_chat_template_renders_a_tool_round_trip(checkpoint: Checkpoint) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint("llama"))
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


# --- the random model as a test oracle ---------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_winners_are_clear(checkpoint: Checkpoint, models: ModelGetter, family: str) -> None:
    path = checkpoint(family)
    num_real_tokens = len(AutoTokenizer.from_pretrained(path))
    ids = _corpus_ids(path, 300)
    with torch.no_grad():
        logits = models(family)(ids).logits[0]  # [300, vocab]
    assert torch.isfinite(logits).all()
    real = logits[:, :num_real_tokens]
    top2 = real.topk(2, dim=-1).values  # [300, 2]
    gaps = top2[:, 0] - top2[:, 1]
    # Measured ~0.9 (median) for every family; fp32 rounding noise is ~1e-5.
    assert gaps.median() > 0.3
    assert 3.0 < real.std(dim=-1).mean() < 10.0
    # Padded vocabulary rows have zero logits and never win.
    assert (logits[:, num_real_tokens:] == 0).all()
    assert (logits.argmax(dim=-1) < num_real_tokens).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_early_token_changes_last_logits(
    checkpoint: Checkpoint, models: ModelGetter, family: str
) -> None:
    ids = _corpus_ids(checkpoint(family), 64)
    changed = ids.clone()
    changed[0, 1] = ids[0, 1] + 1
    model = models(family)
    with torch.no_grad():
        delta = model(ids).logits[0, -1] - model(changed).logits[0, -1]  # [vocab]
    assert delta.abs().max() > 1e-2  # measured ~10


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_is_far_from_uniform(
    checkpoint: Checkpoint, models: ModelGetter, family: str
) -> None:
    ids = _corpus_ids(checkpoint(family), 128)
    with torch.no_grad():
        attentions = models(family)(ids, output_attentions=True).attentions
    probs = torch.stack(attentions)[:, 0, :, 32:, :]  # [layers, heads, queries, keys]
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(dim=-1)  # [layers, heads, queries]
    uniform = torch.arange(33, 129, dtype=torch.float32).log()  # query i sees i + 1 keys
    ratio = entropy / uniform
    assert ratio.mean() < 0.85  # measured ~0.65; near-uniform attention would be ~1.0


@pytest.mark.parametrize("family", FAMILIES)
def test_every_layer_changes_the_residual(
    checkpoint: Checkpoint, models: ModelGetter, family: str
) -> None:
    model = models(family)
    changes: list[float] = []

    # hidden_states[-1] comes after the final norm, so the layers' own inputs and outputs are
    # read with hooks instead.
    def record(_module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        before = args[0] if args else kwargs["hidden_states"]  # [1, tokens, hidden]
        after = output[0] if isinstance(output, tuple) else output
        assert isinstance(after, torch.Tensor)
        changes.append(float((after - before).norm() / before.norm()))

    handles = [
        layer.register_forward_hook(record, with_kwargs=True) for layer in model.model.layers
    ]
    try:
        with torch.no_grad():
            model(_corpus_ids(checkpoint(family), 64))
    finally:
        for handle in handles:
            handle.remove()
    assert len(changes) == model.config.num_hidden_layers
    # Measured 0.4 to 2.3 per layer.
    assert min(changes) > 0.2, changes


# --- the small size, end to end (slow: ~400 MB written) ----------------------------------------


@pytest.mark.slow
def test_small_checkpoint_loads(tmp_path: Path) -> None:
    path = make_model(tmp_path, size="small", family="llama")
    model, info = _load_with_info(path)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert SIZES["small"].min_params <= model.num_parameters() <= SIZES["small"].max_params
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()

"""The served model's tokenizer (transformers, loaded once at start-up) and its chat template.

Encoding goes through the tokenizer's Rust backend (the pipeline transformers built, so the ids
are transformers' own); rendering chat messages uses transformers' `apply_chat_template`.
For byte-level BPE tokenizers (GPT-2, Llama 3, Qwen) every token id maps to raw bytes, which lets
the detokenizer work on bytes and never split a multi-byte character.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tenancy.errors import BadRequest


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (byte-level BPE's alphabet)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


_UNICODE_TO_BYTE = {char: byte for byte, char in _bytes_to_unicode().items()}


class Tokenizer:
    """Encode prompts, render chat templates, and describe tokens as bytes or text."""

    def __init__(self, hf: Any) -> None:
        self._hf = hf
        self._backend = hf.backend_tokenizer
        self.special_ids: frozenset[int] = frozenset(hf.all_special_ids)
        vocab: dict[str, int] = self._backend.get_vocab(with_added_tokens=True)
        self.num_tokens = max(vocab.values()) + 1 if vocab else 0
        template = getattr(hf, "chat_template", None)
        self.has_chat_template = bool(template)
        # A template that never reads `tools` would drop them silently (transformers passes
        # them as a variable); such a model needs LORAGATE_CHAT_TEMPLATE for tools.
        self.renders_tools = isinstance(template, str) and "tools" in template
        # token id -> its bytes (None: skipped when decoding: special, or not in the vocabulary)
        self.token_bytes: list[bytes | None] | None = self._byte_table(vocab)

    @classmethod
    def load(cls, model_dir: Path, chat_template: Path | None = None) -> Tokenizer:
        """The checkpoint's tokenizer; `chat_template` (a Jinja file) replaces its template."""
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        if getattr(hf, "backend_tokenizer", None) is None:
            raise ValueError(f"{model_dir} has no fast (tokenizer.json) tokenizer")
        if chat_template is not None:
            hf.chat_template = chat_template.read_text(encoding="utf-8")
        return cls(hf)

    @property
    def is_byte_level(self) -> bool:
        return self.token_bytes is not None

    def _byte_table(self, vocab: dict[str, int]) -> list[bytes | None] | None:
        if type(self._backend.decoder).__name__ != "ByteLevel":
            return None
        table: list[bytes | None] = [None] * self.num_tokens
        added = {int(token_id): token for token_id, token in self._hf.added_tokens_decoder.items()}
        for token, token_id in vocab.items():
            if token_id in added:
                entry = added[token_id]
                table[token_id] = None if entry.special else str(entry.content).encode()
                continue
            try:
                table[token_id] = bytes(_UNICODE_TO_BYTE[char] for char in token)
            except KeyError:
                return None  # not a pure byte-level vocabulary: use the generic detokenizer
        return table

    # ---- encoding ------------------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def render_chat(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        if not self.has_chat_template:
            raise BadRequest(
                "This model has no chat template; use /v1/completions.", param="messages"
            )
        if tools and not self.renders_tools:
            raise BadRequest(
                "This model's chat template has no tools section; the operator can give it one "
                "(LORAGATE_CHAT_TEMPLATE).",
                param="tools",
            )
        try:
            text = self._hf.apply_chat_template(
                list(messages), tools=tools or None, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # template errors (raise_exception) are about the messages
            raise BadRequest(
                f"The messages do not fit the model's chat template ({type(exc).__name__}).",
                param="messages",
            ) from None
        if not isinstance(text, str):
            raise BadRequest("The chat template did not render to text.", param="messages")
        return text

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        # The template writes special tokens (and BOS) itself, as transformers' tokenize=True does.
        return self.encode(self.render_chat(messages, tools), add_special_tokens=False)

    # ---- decoding ------------------------------------------------------------------------------

    def decode(self, token_ids: Sequence[int]) -> str:
        text: str = self._backend.decode(list(token_ids), skip_special_tokens=True)
        return text

    def bytes_of(self, token_id: int) -> bytes:
        """The token's own bytes (special tokens as their text), for logprobs."""
        table = self.token_bytes
        if table is not None and 0 <= token_id < len(table):
            raw = table[token_id]
            if raw is not None:
                return raw
        text: str = self._backend.decode([token_id], skip_special_tokens=False)
        return text.encode()

    def token_text(self, token_id: int) -> str:
        return self.bytes_of(token_id).decode("utf-8", errors="replace")
